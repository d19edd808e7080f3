"""``eo_stream_detached`` (``EoStreamOperator(deferrable=True)``) under ``dag.test()``: real
Airflow 3, Kafka and spark-submit. The driver runs detached from the task (a launcher in a new
session) and the task waits in a trigger that reads the run's row in the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.core.stream import process_alive
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka.audit import audit_pipeline
from airflow_provider_eo.ledger import CheckpointState, Ledger
from eo_harness import wait_for

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]


def _env(airflow_env: Any, **extra: str) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    airflow_env.env.update(
        {"EO_STREAM_INTERVAL_S": "1", "EO_STREAM_RETRIES": "0", "EO_STREAM_HEARTBEAT_S": "1", **extra}
    )


def _runs(pipeline: Any) -> list[Any]:
    from sqlalchemy import select

    from airflow_provider_eo.ledger.models import StreamRun

    with Ledger(pipeline.ledger_url) as ledger, ledger._db.read() as s:
        ids = [r.run_id for r in s.execute(select(StreamRun).order_by(StreamRun.id)).scalars()]
        return [ledger.get_stream_run(i) for i in ids]


def _audit(pipeline: Any) -> None:
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0, report.as_dict()


def test_detached_stream_defers_and_ends_with_its_summary(airflow_env: Any, kafka_bootstrap: str) -> None:
    _env(airflow_env)
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_stream", dag_attr="detached_dag", conf='{"checkpoints": 2}')

    assert run["state"] == "success", run
    summary = run["xcoms"]["stream"]
    assert summary["checkpoints"] == 2 and summary["reason"] == "checkpoints", summary
    log = airflow_env.log_text()
    assert "started detached" in log and "no worker slot held" in log
    (stream_run,) = _runs(pipeline)
    assert stream_run.state == "ENDED" and stream_run.summary["run_id"] == stream_run.run_id
    assert summary["run_id"] == stream_run.run_id
    # The driver's output went to its own log file, not the task's.
    assert stream_run.log_path and '"checkpoint": 1' in Path(stream_run.log_path).read_text()
    with Ledger(pipeline.ledger_url) as ledger:
        states = [c.state for c in ledger.list_checkpoints(pipeline.name)]
    assert states == [CheckpointState.COMMITTED] * 2
    _audit(pipeline)
