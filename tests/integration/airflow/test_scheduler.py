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

from .conftest import HERE, ROOT, VENV_BIN

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
    airflow_env.add_dag(HERE / "dags" / "eo_scheduled.py")
    # Only the test DAG is scheduled (the example DAG would run the same pipeline too).
    (airflow_env.dags / "eo_pipeline.py").unlink()
    with _deploy(airflow_env) as deployed:
        yield deployed


@pytest.fixture()
def stream_deployment(airflow_env: Any) -> Iterator[Any]:
    """Only dags/eo_stream.py: its commit DAG is scheduled on the asset whose watcher runs in
    the triggerer."""
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    (airflow_env.dags / "eo_pipeline.py").unlink()
    with _deploy(airflow_env) as deployed:
        yield deployed


@contextlib.contextmanager
def _deploy(airflow_env: Any) -> Iterator[Any]:
    port = _free_port()
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


def _dag_runs(home: Path, dag_id: str) -> list[tuple[str, str, str]]:
    """(run_id, run_type, state) of a DAG's runs, from the deployment's metadata database."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        query = "SELECT run_id, run_type, state FROM dag_run WHERE dag_id = ?"
        rows = db.execute(query, (dag_id,)).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def test_asset_watcher_commits_what_the_stream_prepared(
    stream_deployment: Any, kafka_bootstrap: str, spark: Any
) -> None:
    """commit="airflow" for real: the streaming application only prepares (here: the same
    plan + prepare calls, made by the test); the triggerer runs the AssetWatcher's
    EoPreparedCheckpointTrigger, whose event makes the scheduler start eo_stream_commit,
    whose task commits the checkpoint — for two checkpoints in a row, exactly once."""
    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.spark.prepare import prepare_checkpoint

    home = stream_deployment.home
    pipeline = stream_deployment.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])
    with Ledger(pipeline.ledger_url) as ledger:
        for expected in (1, 2):
            cp = plan_checkpoint(pipeline, ledger)
            assert cp is not None and cp.checkpoint_id == expected
            prepare_checkpoint(spark, pipeline, ledger, cp.checkpoint_id)

            def committed(cid: int = expected) -> bool:
                return ledger.get(pipeline.name, cid).state is CheckpointState.COMMITTED

            with contextlib.suppress(AssertionError):
                wait_for(committed, f"checkpoint {expected} committed by the commit DAG", timeout=240)
            assert committed(), f"{_dag_runs(home, 'eo_stream_commit')}\n{_component_logs(home)}"

    def succeeded() -> list[tuple[str, str, str]]:
        runs = _dag_runs(home, "eo_stream_commit")
        return [r for r in runs if r[1] == "asset_triggered" and r[2] == "success"]

    with contextlib.suppress(AssertionError):  # the last run may still be finishing
        wait_for(lambda: len(succeeded()) >= 2, "two asset-triggered commit runs to succeed", timeout=60)
    assert len(succeeded()) >= 2, _dag_runs(home, "eo_stream_commit")
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
