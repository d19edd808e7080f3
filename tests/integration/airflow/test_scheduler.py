"""A real Airflow deployment on 127.0.0.1: api-server, scheduler (LocalExecutor),
dag-processor and triggerer against a temp AIRFLOW_HOME. The pipeline DAG runs on its
schedule, the sensor defers to the triggerer, and checkpoints commit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka.audit import audit_pipeline
from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState, Ledger

from .conftest import HERE, VENV_BIN

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(420)]

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop what this test started: SIGTERM each process group, then SIGKILL stragglers."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    for proc in procs:  # children (LocalExecutor workers, spark-submit) live in the same group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture()
def deployment(airflow_env: Any) -> Iterator[Any]:
    port = _free_port()
    airflow_env.add_dag(HERE / "dags" / "eo_scheduled.py")
    # Only the test DAG is scheduled (the example DAG would run the same pipeline too).
    (airflow_env.dags / "eo_pipeline.py").unlink()
    env = dict(airflow_env.env)
    env.update(
        {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
        }
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in COMPONENTS:
            args = [str(VENV_BIN / "airflow"), name]
            if name == "api-server":
                args += ["--host", "127.0.0.1", "--port", str(port)]
            log = (airflow_env.home / f"{name}.log").open("wb")
            procs.append(
                subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        yield airflow_env
    finally:
        _stop(procs)


def _deferred_runs(home: Path) -> set[str]:
    """Runs whose ``eo.wait`` deferred and whose trigger fired a success event in the
    triggerer (the triggerer writes ``attempt=N.log.trigger.<id>.log`` next to the task log)."""
    runs = set()
    for log in (home / "logs" / "dag_id=eo_scheduled").glob(
        "run_id=*/task_id=eo.wait/attempt=*.log.trigger.*.log"
    ):
        text = log.read_text(errors="replace")
        if "Trigger fired event" in text and "'status': 'success'" in text:
            task_log = log.parent / log.name.split(".log.trigger.")[0]
            if "Pausing task as DEFERRED" in task_log.with_name(task_log.name + ".log").read_text(
                errors="replace"
            ):
                runs.add(log.parent.parent.name.removeprefix("run_id="))
    return runs


def _component_logs(home: Path) -> str:
    return "\n".join(
        f"--- {name} ---\n{(home / f'{name}.log').read_text(errors='replace')[-3000:]}" for name in COMPONENTS
    )


def test_scheduled_runs_defer_and_commit(deployment: Any, kafka_bootstrap: str) -> None:
    pipeline = deployment.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])
    deferred: set[str] = set()
    committed: list[Any] = []

    def progressed() -> bool:
        nonlocal deferred, committed
        deferred = _deferred_runs(deployment.home)
        if Path(pipeline.ledger_url.removeprefix("sqlite:///")).exists():
            with Ledger(pipeline.ledger_url) as ledger, contextlib.suppress(CheckpointNotFound):
                # the file exists before the first plan task has registered the pipeline
                committed = [
                    c for c in ledger.list_checkpoints(pipeline.name) if c.state is CheckpointState.COMMITTED
                ]
        return len(committed) >= 2 and bool(deferred)

    with contextlib.suppress(AssertionError):  # the asserts below report what was missing
        wait_for(progressed, "two committed checkpoints and a deferral", timeout=300)
    assert len(committed) >= 2, (
        f"{len(committed)} checkpoint(s) committed\n{_component_logs(deployment.home)}"
    )
    assert deferred, f"no eo.wait deferral found in the task logs\n{_component_logs(deployment.home)}"
    # Each checkpoint came from its own scheduled run, recorded in the ledger's lineage.
    assert all(c.run_id and c.run_id.startswith("scheduled__") for c in committed)
    assert len({c.run_id for c in committed}) == len(committed)
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
    # The wait of a committed checkpoint's run went through the triggerer.
    assert deferred & {c.run_id for c in committed}, (deferred, [c.run_id for c in committed])
