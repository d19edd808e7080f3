"""Event-driven pipeline runs under a real Airflow deployment (api-server, scheduler,
dag-processor, triggerer): ``dags/eo_pipeline.py`` is scheduled on its source asset, whose
watcher (EoSourceRecordsTrigger, in the triggerer) fires when the source holds records the
ledger has not planned. An idle source runs nothing; records run one DAG run that plans
and commits them, and no second run for them; records produced while the triggerer is
down are picked up by one run once it is back. Exactly once, counted against the source."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from eo_harness import poll_until, wait_for
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState, Ledger

from .test_scheduler import _component_logs, _dag_runs, _deploy

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

DAG_ID = "eo_pipeline"
WATCHER = "airflow_provider_eo.triggers.source.EoSourceRecordsTrigger"
POLL_S = 1.0


def _watcher_started(home: Path, since: int = 0) -> bool:
    """The source watcher's trigger row exists and the triggerer's log (from byte ``since``)
    shows it starting."""
    try:
        with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
            ids = [r[0] for r in db.execute("SELECT id FROM trigger WHERE classpath = ?", (WATCHER,))]
    except sqlite3.OperationalError:  # locked by a writer: the next poll reads it
        return False
    log = home / "triggerer.log"
    if not ids or not log.exists():
        return False
    with log.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return any(f"trigger ID {i} starting" in text for i in ids)


def _triggering_payloads(home: Path) -> dict[str, list[dict[str, Any]]]:
    """Per eo_pipeline run: the payloads of the watcher's events that triggered it."""
    query = (
        "SELECT dr.run_id, ae.extra FROM dag_run dr "
        "JOIN dagrun_asset_event dae ON dae.dag_run_id = dr.id "
        "JOIN asset_event ae ON ae.id = dae.event_id WHERE dr.dag_id = ?"
    )
    out: dict[str, list[dict[str, Any]]] = {}
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        for run_id, extra in db.execute(query, (DAG_ID,)):
            out.setdefault(str(run_id), []).append(json.loads(extra)["payload"])
    return out


def _runs(home: Path) -> list[tuple[str, str, str]]:
    try:
        return _dag_runs(home, DAG_ID)
    except sqlite3.OperationalError:
        return []


def test_the_pipeline_dag_runs_once_per_arrival_of_source_records(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    airflow_env.env.update(
        {
            "EO_SOURCE_POLL_S": str(POLL_S),
            # Far beyond the test: every event here comes from new records, none from a refire.
            "EO_SOURCE_REFIRE_S": "3600",
            # One checkpoint takes all a sample holds: one run per arrival.
            "EO_DEMO_MAX_RECORDS": "100000",
        }
    )
    pipeline = airflow_env.pipeline()
    config = librdkafka_config(pipeline.kafka)
    topic = pipeline.source_topics[0]
    partitions = [(topic, p) for p in admin.partitions_of(config, [topic])[topic]]

    def ledger_state() -> tuple[list[Any], int]:
        """(checkpoints, the watch mark's seq), empty while the ledger has none."""
        if not Path(pipeline.ledger_url.removeprefix("sqlite:///")).exists():
            return [], 0
        with Ledger(pipeline.ledger_url) as ledger:
            seq = ledger.get_watch_mark(pipeline.name, "source").seq
            try:
                return ledger.list_checkpoints(pipeline.name), seq
            except CheckpointNotFound:
                return [], seq

    def planned_and_committed_everything(runs: int) -> bool:
        """Every source record is in a COMMITTED checkpoint and ``runs`` runs succeeded."""
        checkpoints, _ = ledger_state()
        if not checkpoints or any(c.state is not CheckpointState.COMMITTED for c in checkpoints):
            return False
        ends = admin.list_offsets(config, partitions, spec="latest")
        covered = {(r.topic, r.partition): r.end for r in checkpoints[-1].ranges}
        done = [r for r in _runs(home) if r[2] == "success"]
        return covered == ends and len(done) == runs

    with _deploy(airflow_env) as deployed:
        home = deployed.home
        wait_for(lambda: _watcher_started(home), "the source watcher to run in the triggerer", timeout=180)

        # 1. An idle source: no run for several polls, nothing fired.
        assert not poll_until(lambda: bool(_runs(home)), timeout=8 * POLL_S), _runs(home)
        assert ledger_state() == ([], 0)

        # 2. Records: one run plans and commits them all; no second run for them.
        produced = produce_sample(kafka_bootstrap, topic)[0]
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: planned_and_committed_everything(1), "one run committing the records", timeout=300
            )
        assert planned_and_committed_everything(1), f"{_runs(home)}\n{_component_logs(home)}"
        assert not poll_until(lambda: len(_runs(home)) > 1, timeout=8 * POLL_S), _runs(home)
        assert ledger_state()[1] == 1

        # 3. The triggerer is down while records arrive: nothing runs; back up, it fires
        #    once for them (its state was in the ledger, the offsets are read afresh). It comes
        #    back as a production triggerer runs: the pipeline's module lives only in the DAGs
        #    folder, which the triggerer does not load, so the watcher runs on the settings
        #    recorded when the DAG was parsed.
        triggerer = deployed.components["triggerer"]
        os.killpg(triggerer.pid, signal.SIGTERM)
        triggerer.wait(timeout=60)
        restarted_at = (home / "triggerer.log").stat().st_size
        produced += produce_sample(kafka_bootstrap, topic)[0]
        assert not poll_until(lambda: len(_runs(home)) > 1, timeout=5 * POLL_S), _runs(home)
        dags_folder = airflow_env.env["AIRFLOW__CORE__DAGS_FOLDER"]
        without_dags = os.pathsep.join(
            p for p in airflow_env.env["PYTHONPATH"].split(os.pathsep) if Path(p) != Path(dags_folder)
        )
        deployed.start_component("triggerer", {"PYTHONPATH": without_dags})
        wait_for(
            lambda: _watcher_started(home, restarted_at), "the restarted triggerer to run the watcher", 180
        )
        with contextlib.suppress(AssertionError):
            wait_for(lambda: planned_and_committed_everything(2), "a run for the records", timeout=300)
        assert planned_and_committed_everything(2), f"{_runs(home)}\n{_component_logs(home)}"
        assert not poll_until(lambda: len(_runs(home)) > 2, timeout=8 * POLL_S), _runs(home)
        assert ledger_state()[1] == 2
        with (home / "triggerer.log").open("rb") as f:
            f.seek(restarted_at)
            restarted_log = f.read().decode(errors="replace")
        assert "cannot import 'eo_demo_pipelines'" in restarted_log, restarted_log[-3000:]
        assert "watching with the settings recorded when the DAG was parsed" in restarted_log

        runs = _runs(home)
        payloads = _triggering_payloads(home)

    assert all(run_type == "asset_triggered" for _, run_type, _ in runs), runs
    checkpoints, _ = ledger_state()
    # Two runs, each planned one checkpoint, each caused by one event of its own.
    assert sorted(payloads) == sorted(str(c.run_id) for c in checkpoints) and len(checkpoints) == 2
    for cp in checkpoints:
        (event,) = payloads[str(cp.run_id)]  # one event per run
        assert event["pipeline"] == pipeline.name and event["status"] == "source_records"
        # The plan covered everything the event saw (same notion of the end: the LSO).
        ends = {(r.topic, r.partition): r.end for r in cp.ranges}
        assert all(ends[(p["topic"], p["partition"])] >= p["source_end"] for p in event["partitions"]), event
    assert [payloads[str(c.run_id)][0]["fire"] for c in checkpoints] == [1, 2]
    assert_sink_is_source_exactly_once(pipeline.kafka, pipeline, source_records=produced)
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
