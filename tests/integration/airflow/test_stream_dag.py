"""dags/eo_stream.py under ``dag.test()``: real Airflow 3, Kafka and spark-submit of the
streaming application (``apps/stream.py`` on ``local[2]``, client mode)."""

from __future__ import annotations

from typing import Any

import pytest
from eo_harness import poll_until
from eo_statsd import statsd_env, statsd_listener

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]


def _stream_env(airflow_env: Any, **extra: str) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    airflow_env.env.update({"EO_STREAM_INTERVAL_S": "1", "EO_STREAM_RETRIES": "0", **extra})


def _checkpoints(pipeline: Any) -> list[Any]:
    with Ledger(pipeline.ledger_url) as ledger:
        return ledger.list_checkpoints(pipeline.name)


def _audit(pipeline: Any) -> None:
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0, report.as_dict()


def test_driver_death_fails_the_task_then_a_new_try_resumes_and_commits_n_checkpoints(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    """The streaming driver dies after staging checkpoint 1: the task fails with the driver's
    reason and checkpoint 1 stays PLANNED. The next run (``{"checkpoints": 2}``) resumes it and
    commits it and checkpoint 2 inline, exactly once, with the driver's metrics for both."""
    _stream_env(airflow_env, EO_FAULT="prepare.after_write", EO_FAULT_ACTION="exit")
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_stream", conf='{"checkpoints": 1}')

    assert run["state"] == "failed" and run["tis"]["stream"]["state"] == "failed", run
    log = airflow_env.log_text()
    assert "StreamDriverFailed" in log and "the streaming application's driver died (exit code" in log
    assert "injected fault at prepare.after_write" in log  # the driver's own reason, in the task's error
    (cp,) = _checkpoints(pipeline)
    assert cp.state is CheckpointState.PLANNED
    del airflow_env.env["EO_FAULT"], airflow_env.env["EO_FAULT_ACTION"]

    # The driver's metrics (it is not an Airflow task: it sends through Airflow's Stats from
    # the [metrics] settings it inherits), to a StatsD listener in InfluxDB tag mode.
    with statsd_listener() as statsd:
        airflow_env.env.update(statsd_env(statsd.port))
        (again,) = airflow_env.run_dag_test("eo_stream", conf='{"checkpoints": 2}')
        poll_until(lambda: len(statsd.metrics("airflow.eo.checkpoint.records")) >= 2, timeout=10)
        sent = statsd.metrics("airflow.eo.")

    assert again["state"] == "success", again
    summary = again["xcoms"]["stream"]
    assert summary["checkpoints"] == 2 and summary["reason"] == "checkpoints", summary
    assert summary["unfinished"] == [], summary
    checkpoints = _checkpoints(pipeline)
    assert [c.checkpoint_id for c in checkpoints] == [1, 2]  # 1 resumed, not planned again
    assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED] * 2
    assert summary["records"] == sum(c.records or 0 for c in checkpoints) > 0
    _audit(pipeline)
    assert sent and all(m.tags == {"pipeline": pipeline.name} for m in sent), sent
    records = [m.value for m in sent if m.name == "airflow.eo.checkpoint.records"]
    assert sorted(records) == sorted(c.records for c in checkpoints), sent
    for timer in ("airflow.eo.prepare.seconds", "airflow.eo.commit.seconds"):
        assert len([m for m in sent if m.name == timer and m.kind == "ms"]) == 2, (timer, sent)
    assert [m.value for m in sent if m.name == "airflow.eo.dead_letters"] == [0, 0], sent
    # Lag after each inline commit; the last one is what the source still holds beyond it.
    lags = [m for m in sent if m.name == "airflow.eo.lag.records"]
    assert len(lags) == 2 and all(m.kind == "g" for m in lags), sent
    last = max(checkpoints, key=lambda c: c.checkpoint_id)
    ends = {(r.topic, r.partition): r.end for r in last.ranges}
    log_ends = admin.list_offsets(pipeline.kafka, list(ends), spec="latest")
    assert lags[-1].value == sum(log_ends[tp] - end for tp, end in ends.items()), sent


def test_airflow_commit_mode_commit_dag_runs_commit_prepared_checkpoints(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    _stream_env(airflow_env, EO_STREAM_RETRIES="1")
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    # The demo pipeline's max_pending is 1: the stream waits (back-pressure) while a
    # PREPARED checkpoint is not committed, so one bounded run prepares one checkpoint.
    (run,) = airflow_env.run_dag_test("eo_stream", dag_attr="prepare_dag", conf='{"checkpoints": 1}')
    assert run["state"] == "success", run
    assert [c.state for c in _checkpoints(pipeline)] == [CheckpointState.PREPARED]

    # The first commit task dies right after its Kafka transaction committed (before the
    # ledger knew): its retry finds the markers and finishes without publishing again.
    runs = airflow_env.run_dag_test(
        "eo_stream", dag_attr="commit_dag", runs=2, commit_task="commit", commit_fault_runs="1"
    )
    assert [r["xcoms"].get("lowest_prepared") for r in runs] == [1, None], runs
    assert [r["tis"]["commit"]["state"] for r in runs] == ["success", "skipped"], runs
    assert runs[0]["tis"]["commit"]["try_number"] == 2, runs  # try 1 was killed, try 2 finished
    assert runs[0]["xcoms"]["commit"]["published"] == 0, runs  # ... by the markers: nothing re-sent
    assert "injected fault at commit.after_commit_txn" in airflow_env.log_text()
    assert [c.state for c in _checkpoints(pipeline)] == [CheckpointState.COMMITTED]
    _audit(pipeline)
