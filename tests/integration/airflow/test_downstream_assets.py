"""Data-aware scheduling under a real Airflow deployment (api-server, scheduler,
dag-processor, triggerer): a checkpoint the example pipeline DAG commits is an event on its
sink asset, which creates a run of dags/eo_downstream.py whose triggering event carries
that checkpoint."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import ROOT
from .test_scheduler import _component_logs, _deploy

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(420)]


def _downstream_events(home: Path) -> list[tuple[str, dict[str, Any]]]:
    """(run state, triggering event extra) of each eo_downstream run, from the deployment's
    metadata database."""
    query = (
        "SELECT dr.state, ae.extra FROM dag_run dr "
        "JOIN dagrun_asset_event dae ON dae.dag_run_id = dr.id "
        "JOIN asset_event ae ON ae.id = dae.event_id WHERE dr.dag_id = 'eo_downstream'"
    )
    try:
        with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
            rows = db.execute(query).fetchall()
    except sqlite3.OperationalError:  # locked by a writer: the next poll reads it
        return []
    return [(str(state), json.loads(extra) if extra else {}) for state, extra in rows]


def test_a_committed_checkpoint_runs_the_downstream_dag(airflow_env: Any, kafka_bootstrap: str) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_downstream.py")
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])  # there before the first plan
    with _deploy(airflow_env) as deployed:
        events: list[tuple[str, dict[str, Any]]] = []

        def downstream_succeeded() -> bool:
            nonlocal events
            events = _downstream_events(deployed.home)
            return any(state == "success" for state, _ in events)

        with contextlib.suppress(AssertionError):  # the assert below reports what was missing
            wait_for(downstream_succeeded, "a successful eo_downstream run", timeout=300)
        assert any(state == "success" for state, _ in events), (
            f"eo_downstream runs: {events}\n{_component_logs(deployed.home)}"
        )
    with Ledger(pipeline.ledger_url) as ledger:
        committed = {
            c.checkpoint_id: c
            for c in ledger.list_checkpoints(pipeline.name)
            if c.state is CheckpointState.COMMITTED
        }
    extra = next(extra for state, extra in events if state == "success")
    cp = committed[extra["checkpoint_id"]]
    assert extra["pipeline"] == pipeline.name and extra["sink_topic"] == pipeline.sink_topic
    assert extra["records"] == cp.records and len(extra["ranges"]) == len(cp.ranges)
    assert extra["lineage"]["dag_id"] == "eo_pipeline" and extra["lineage"]["task_id"] == "eo.commit"
    assert extra["lineage"]["run_id"] == cp.run_id
