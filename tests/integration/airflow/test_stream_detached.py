"""``eo_stream_detached`` (``EoStreamOperator(deferrable=True)``) under ``dag.test()``: real
Airflow 3, Kafka and spark-submit. The driver runs detached from the task (a launcher in a new
session) and the task waits in a trigger that reads the run's row in the ledger."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.processes import pid_alive

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]


def _env(airflow_env: Any, **extra: str) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    airflow_env.env.update(
        {
            "EO_STREAM_INTERVAL_S": "1",
            "EO_STREAM_RETRIES": "0",
            "EO_STREAM_HEARTBEAT_S": "1",
            "EO_STREAM_LOG_DIR": str(airflow_env.home / "stream-logs"),
            **extra,
        }
    )


def _runs(pipeline: Any) -> list[Any]:
    from sqlalchemy import select

    from airflow_provider_eo.ledger.models import StreamRun

    with Ledger(pipeline.ledger_url) as ledger, ledger._db.read() as s:
        ids = [r.run_id for r in s.execute(select(StreamRun).order_by(StreamRun.id)).scalars()]
        return [ledger.get_stream_run(i) for i in ids]


def _log_has(airflow_env: Any, text: str) -> bool:
    """Whether the running dag.test's log shows ``text`` yet (its file may not exist yet)."""
    try:
        return text in airflow_env.log_text()
    except FileNotFoundError:
        return False


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


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # surfaced by the test after join
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_killed_detached_driver_fails_the_task_and_the_next_try_resumes(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    _env(airflow_env)
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    thread, out = _in_thread(
        lambda: airflow_env.run_dag_test("eo_stream", dag_attr="detached_dag", conf='{"duration": 300}')
    )

    def committed_one() -> bool:
        if not Path(pipeline.ledger_url.removeprefix("sqlite:///")).exists():
            return False
        with Ledger(pipeline.ledger_url) as ledger:
            try:
                return ledger.last_committed(pipeline.name) is not None
            except Exception:
                return False

    wait_for(committed_one, "the detached stream's first committed checkpoint", timeout=240)
    (running,) = _runs(pipeline)
    assert running.state == "RUNNING" and pid_alive(running.pid)
    os.kill(running.pid, signal.SIGKILL)  # the driver, as the OOM killer would
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in out, out
    (run,) = out["result"]
    assert run["state"] == "failed" and run["tis"]["stream"]["state"] == "failed", run
    log = airflow_env.log_text()
    assert "StreamDriverFailed" in log and "detached driver failed" in log, log[-3000:]
    assert "exited without ending its run" in log and "Error code is: 137" in log  # SIGKILL, told at once
    (dead,) = _runs(pipeline)
    assert dead.state == "FAILED" and dead.run_id == running.run_id

    # The next try starts a new driver, which resumes whatever the killed one left.
    (again,) = airflow_env.run_dag_test("eo_stream", dag_attr="detached_dag", conf='{"checkpoints": 1}')
    assert again["state"] == "success", again
    runs = _runs(pipeline)
    assert [r.state for r in runs] == ["FAILED", "ENDED"], runs
    with Ledger(pipeline.ledger_url) as ledger:
        assert ledger.unfinished(pipeline.name) is None
    _audit(pipeline)


def test_a_retry_reattaches_to_its_live_run_instead_of_starting_a_second_driver(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    _env(airflow_env)
    pipeline = airflow_env.pipeline()
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        # A driver an earlier try of this task started, still beating.
        live = ledger.register_stream_run(
            pipeline.name,
            run_id="earlier-try",
            host="elsewhere",
            pid=1,
            commit_mode="inline",
            heartbeat_s=1.0,
            dag_id="eo_stream_detached",
            task_id="stream",
        )
    beating = threading.Event()

    def beat() -> None:
        with Ledger(pipeline.ledger_url) as ledger:
            while not beating.wait(0.5):
                ledger.heartbeat_stream_run(live.run_id)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        thread, out = _in_thread(
            lambda: airflow_env.run_dag_test("eo_stream", dag_attr="detached_dag", conf='{"checkpoints": 1}')
        )
        wait_for(lambda: _log_has(airflow_env, "re-attaching"), "the task to re-attach", timeout=180)
        with Ledger(pipeline.ledger_url) as ledger:
            ledger.end_stream_run(
                live.run_id, state="ENDED", reason="checkpoints", summary={"checkpoints": 7, "records": 70}
            )
    finally:
        beating.set()
        beater.join()
    thread.join(timeout=300)
    assert "error" not in out, out
    (run,) = out["result"]
    assert run["state"] == "success", run
    assert run["xcoms"]["stream"]["checkpoints"] == 7  # the re-attached run's summary
    assert [r.run_id for r in _runs(pipeline)] == ["earlier-try"]  # no second driver
