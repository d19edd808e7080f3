"""A real Airflow deployment on 127.0.0.1: api-server, scheduler (LocalExecutor),
dag-processor and triggerer against a temp AIRFLOW_HOME. The pipeline DAG runs on its
schedule, the sensor defers to the triggerer, and checkpoints commit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import poll_until, wait_for

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState, Ledger

from .conftest import HERE, ROOT, VENV_BIN

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(420)]

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop what this test started: SIGTERM each process group, then SIGKILL stragglers (the
    test is over: a component still finishing its work after 5 s is not waited for)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
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
    """dags/eo_stream.py (its commit DAG is scheduled on the asset whose watcher runs in the
    triggerer) and dags/eo_downstream.py (scheduled on the sink asset, which makes that asset's
    watcher of stream-committed checkpoints run)."""
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    airflow_env.add_dag(ROOT / "dags" / "eo_downstream.py")
    (airflow_env.dags / "eo_pipeline.py").unlink()
    with _deploy(airflow_env) as deployed:
        yield deployed


@pytest.fixture()
def detached_deployment(airflow_env: Any) -> Iterator[Any]:
    """dags/eo_stream.py with an admin who may call the REST API (to trigger and to mark a
    task failed as a user would in the UI)."""
    airflow_env.add_dag(ROOT / "dags" / "eo_stream.py")
    (airflow_env.dags / "eo_pipeline.py").unlink()
    (airflow_env.home / "passwords.json").write_text('{"admin": "admin-pw"}')
    airflow_env.env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_env.home / "passwords.json"),
            "EO_STREAM_INTERVAL_S": "1",
            "EO_STREAM_HEARTBEAT_S": "1",
            "EO_STREAM_RETRIES": "0",
            "EO_STREAM_LOG_DIR": str(airflow_env.home / "stream-logs"),
        }
    )
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
    airflow_env.api_url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start one component (again: its log is appended to), its environment updated with
        ``extra_env``; stopped with the others."""
        args = [str(VENV_BIN / "airflow"), name]
        if name == "api-server":
            args += ["--host", "127.0.0.1", "--port", str(port)]
        log = (airflow_env.home / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            args,
            env={**env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        airflow_env.components[name] = proc
        return proc

    airflow_env.components = {}
    airflow_env.start_component = start
    try:
        for name in COMPONENTS:
            start(name)
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
    whose task commits the checkpoint — for two checkpoints in a row, exactly once.

    Then a stream with commit="inline" (as eo_stream's task runs it) commits a third
    checkpoint in its driver: the sink asset's watcher (EoStreamCommitsTrigger) announces it,
    and only it, to eo_downstream; the first two were announced by the commit task's outlet.
    Each checkpoint reaches eo_downstream exactly once."""
    from airflow_provider_eo.assets import event_checkpoint, sink_asset
    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.core.stream import run_stream
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.spark.stager import SparkStager

    from .test_downstream_assets import _downstream_events

    home = stream_deployment.home
    pipeline = stream_deployment.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    def announcer_started() -> bool:
        if not Path(pipeline.ledger_url.removeprefix("sqlite:///")).exists():
            return False
        with Ledger(pipeline.ledger_url) as ledger:
            return ledger.get_watch_mark(pipeline.name, "stream_commits").seq > 0

    # From before the first checkpoint: the announcer sees every commit of this test.
    with contextlib.suppress(AssertionError):
        wait_for(announcer_started, "the sink asset's watcher to start", timeout=180)
    assert announcer_started(), _component_logs(home)
    with Ledger(pipeline.ledger_url) as ledger:
        for expected in (1, 2):
            cp = plan_checkpoint(pipeline, ledger)
            assert cp is not None and cp.checkpoint_id == expected
            prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=SparkStager(spark))

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

    stream_task = Actor(dag_id="eo_stream", run_id="manual__inline", task_id="stream", try_number=1)
    result = run_stream(
        pipeline,
        commit="inline",
        max_checkpoints=1,
        interval_s=1,
        stager=SparkStager(spark),
        actor=stream_task,
    )
    assert [c.checkpoint_id for c in result.checkpoints] == [3], result.summary()

    sink_uri = sink_asset(pipeline).uri

    def announced() -> dict[int, list[dict[str, Any]]]:
        """The sink asset's events (whoever emitted them) by checkpoint id."""
        query = "SELECT ae.extra FROM asset_event ae JOIN asset a ON a.id = ae.asset_id WHERE a.uri = ?"
        by_checkpoint: dict[int, list[dict[str, Any]]] = {}
        # A database locked by a writer reads as nothing yet: the next poll reads it.
        with (
            contextlib.suppress(sqlite3.OperationalError),
            contextlib.closing(sqlite3.connect(home / "airflow.db")) as db,
        ):
            for (extra,) in db.execute(query, (sink_uri,)):
                cp = event_checkpoint(json.loads(extra))
                by_checkpoint.setdefault(cp["checkpoint_id"], []).append(json.loads(extra))
        return by_checkpoint

    def downstream_ran_for_the_stream() -> bool:
        return any(
            state == "success" and extra.get("from_trigger") and event_checkpoint(extra)["checkpoint_id"] == 3
            for state, extra in _downstream_events(home)
        )

    with contextlib.suppress(AssertionError):
        wait_for(
            lambda: set(announced()) == {1, 2, 3} and downstream_ran_for_the_stream(),
            "checkpoints 1-3 announced and an eo_downstream run for the stream's",
            timeout=180,
        )
    events = announced()
    assert sorted(events) == [1, 2, 3] and downstream_ran_for_the_stream(), (
        f"{events}\n{_component_logs(home)}"
    )
    assert not poll_until(lambda: any(len(e) > 1 for e in announced().values()), timeout=5), announced()
    # 1 and 2 by the commit task's outlet, 3 by the watcher, with the same extra.
    assert [bool(events[c][0].get("from_trigger")) for c in (1, 2, 3)] == [False, False, True], events
    assert events[1][0]["lineage"]["dag_id"] == "eo_stream_commit"
    stream_event = event_checkpoint(events[3][0])
    with Ledger(pipeline.ledger_url) as ledger:
        cp = ledger.get(pipeline.name, 3)
        report = audit_pipeline(pipeline, ledger)
    assert stream_event["lineage"]["dag_id"] == "eo_stream" and stream_event["records"] == cp.records
    assert stream_event["ranges"] == [
        {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in cp.ranges
    ]
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()


def _ti_state(home: Path, dag_id: str, task_id: str) -> str | None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        row = db.execute(
            "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = ?", (dag_id, task_id)
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def test_detached_stream_frees_the_worker_slot_and_marking_it_failed_stops_it(
    detached_deployment: Any, kafka_bootstrap: str
) -> None:
    """eo_stream_detached under a real scheduler, LocalExecutor and triggerer: the task defers
    while the detached driver keeps streaming (its heartbeat advances after the task process
    is gone); marking the deferred task failed, as a user does in the UI, makes the triggerer
    call on_kill, which asks the run to stop: the driver finishes its in-flight checkpoints
    and exits, nothing unfinished, exactly once."""
    import httpx

    from airflow_provider_eo.processes import pid_alive

    home = detached_deployment.home
    api = detached_deployment.api_url
    pipeline = detached_deployment.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    def token() -> str:
        r = httpx.post(f"{api}/auth/token", json={"username": "admin", "password": "admin-pw"}, timeout=30)
        r.raise_for_status()
        return str(r.json()["access_token"])

    run_id: str | None = None

    def triggered() -> bool:
        nonlocal run_id
        try:
            r = httpx.post(
                f"{api}/api/v2/dags/eo_stream_detached/dagRuns",
                json={"logical_date": None, "conf": {"duration": 600}},
                headers={"Authorization": f"Bearer {token()}"},
                timeout=30,
            )
        except httpx.HTTPError:
            return False  # the api-server is still starting
        if r.status_code == 200:
            run_id = r.json()["dag_run_id"]
        return run_id is not None  # 404 until the dag-processor parsed the DAG

    wait_for(triggered, "the api-server to accept the eo_stream_detached run", timeout=180)

    def streaming() -> bool:
        if not Path(pipeline.ledger_url.removeprefix("sqlite:///")).exists():
            return False
        with Ledger(pipeline.ledger_url) as ledger, contextlib.suppress(CheckpointNotFound):
            return (
                ledger.live_stream_run(pipeline.name) is not None
                and ledger.last_committed(pipeline.name) is not None
                and _ti_state(home, "eo_stream_detached", "stream") == "deferred"
            )
        return False

    with contextlib.suppress(AssertionError):
        wait_for(streaming, "a committed checkpoint while the task is deferred", timeout=240)
    assert streaming(), f"{_ti_state(home, 'eo_stream_detached', 'stream')}\n{_component_logs(home)}"
    with Ledger(pipeline.ledger_url) as ledger:
        live = ledger.live_stream_run(pipeline.name)
        assert live is not None and pid_alive(live.pid)
        beat = live.heartbeat_at
        # The task process is gone (deferred): the driver lives on and keeps beating.
        wait_for(
            lambda: ledger.get_stream_run(live.run_id).heartbeat_at > beat, "a later heartbeat", timeout=30
        )

    r = httpx.patch(
        f"{api}/api/v2/dags/eo_stream_detached/dagRuns/{run_id}/taskInstances/stream",
        json={"new_state": "failed"},
        headers={"Authorization": f"Bearer {token()}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text

    with Ledger(pipeline.ledger_url) as ledger:
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: ledger.get_stream_run(live.run_id).state != "RUNNING", "the run to end", timeout=120
            )
        ended = ledger.get_stream_run(live.run_id)
        assert ended.state == "ENDED", f"{ended}\n{_component_logs(home)}"
        assert ended.reason == "stop requested by airflow: the waiting task was stopped", ended.reason
        assert ended.summary is not None and ended.summary["unfinished"] == []
        assert ledger.unfinished(pipeline.name) is None
        wait_for(lambda: not pid_alive(live.pid), "the driver process to exit", timeout=60)
        report = audit_pipeline(pipeline, ledger)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
