"""``EoQueryOperator`` under ``dag.test()``: the task spark-submits a user's Structured Streaming
application whose query writes through ``KafkaExactlyOnceSink``, and ends with the query's run
in the ledger."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import wait_for

from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.processes import pid_alive

from .conftest import HERE

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

TESTS = HERE.parents[1]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # looked at by the test after join
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _log_has(airflow_env: Any, text: str) -> bool:
    """Whether the dag.test logs show ``text`` yet (the newest file may not exist yet)."""
    try:
        return text in airflow_env.log_text()
    except FileNotFoundError:
        return False


def test_the_query_task_runs_the_application_and_ends_with_its_run(
    airflow_env: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    source, sink = make_topic("ssa-src", partitions=2), make_topic("ssa-out", partitions=2)
    name = f"ssa-{uuid.uuid4().hex[:6]}"
    ledger_url = f"sqlite:///{airflow_env.home / 'ss-ledger.db'}"
    _install_query_dag(airflow_env, kafka_config, name, source, sink, ledger_url, kind="count")
    producer = Producer(kafka_config)
    for i in range(100):
        producer.produce(source, key=f"k{i % 5}", value=str(i), partition=i % 2)
    assert producer.flush(30) == 0

    runs = airflow_env.run_dag_test("eo_ss_query_dag")
    assert runs[0]["tis"]["query"]["state"] == "success", runs
    run = runs[0]["xcoms"]["query"]  # the query's run, as the ledger has it
    assert run["state"] == "ENDED" and run["run_id"].startswith("af-query-") and run["pipeline"] == name

    with Ledger(ledger_url) as ledger:
        committed = [c for c in ledger.list_checkpoints(name) if c.state is CheckpointState.COMMITTED]
    assert [c.batch_id for c in committed] == [0, 1, 2] and sum(c.records or 0 for c in committed) == 15
    values = Counter(m.value().decode() for m in read_sink(kafka_config, sink))
    assert all(n == 1 for n in values.values()) and {f"k{i}=20" for i in range(5)} <= set(values)


def test_a_killed_deferred_query_task_reattaches_to_its_running_query(
    airflow_env: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    """Deferred (the tests' ``default_deferrable``), the query runs detached; the task's process
    is killed (a worker lost) while the query runs; the task's next try in the same DAG run
    re-attaches to that query instead of starting a second one, and ends with its run."""
    source, sink = make_topic("ssk-src", partitions=2), make_topic("ssk-out", partitions=2)
    name = f"ssk-{uuid.uuid4().hex[:6]}"
    # The fixture's ledger: its teardown stops a detached query this test left running.
    ledger_url = airflow_env.env["EO_LEDGER_URL"]
    _install_query_dag(
        airflow_env, kafka_config, name, source, sink, ledger_url, kind="identity", trigger_s=1
    )  # trigger_s: runs until a stop request
    producer = Producer(kafka_config)

    def produce(first: int, n: int) -> None:
        for i in range(first, first + n):
            producer.produce(source, key=f"k{i % 5}", value=str(i), partition=i % 2)
        assert producer.flush(30) == 0

    produce(0, 30)
    # Both tries in one DAG run (its id: manual__<run_after>), as a retry's would be.
    same_run = {"logical_dates": "2025-01-01T00:00:00+00:00", "run_after": "2025-01-01T00:00:00+00:00"}

    def live() -> Any:
        if not Path(ledger_url.removeprefix("sqlite:///")).exists():
            return None
        with Ledger(ledger_url) as ledger:
            try:
                run = ledger.live_stream_run(name)
                committed = ledger.last_committed(name)
            except Exception:
                return None
        return run if run is not None and committed is not None else None

    first, first_out = _in_thread(lambda: airflow_env.run_dag_test("eo_ss_query_dag", **same_run))
    wait_for(lambda: live() is not None, "the detached query's first committed batch", timeout=120)
    assert _log_has(airflow_env, "Waiting in the triggerer (no worker slot held)")
    running = live()
    # The task's process dies (its worker is lost); the detached query does not.
    os.killpg(airflow_env.procs[-1].pid, signal.SIGKILL)
    first.join(timeout=60)
    assert "error" in first_out  # the killed dag.test reported nothing
    produce(30, 20)

    second, second_out = _in_thread(lambda: airflow_env.run_dag_test("eo_ss_query_dag", **same_run))
    wait_for(
        lambda: _log_has(airflow_env, "re-attaching to it") or not second.is_alive(),
        "the next try to re-attach",
        timeout=90,
    )
    assert _log_has(airflow_env, "re-attaching to it"), second_out
    still = live()
    assert still is not None and still.run_id == running.run_id and pid_alive(still.pid)
    wait_for(
        lambda: len(read_sink(kafka_config, sink)) >= 50, "the records produced after the kill", timeout=60
    )
    with Ledger(ledger_url) as ledger:
        ledger.request_stream_stop(name, requested_by="the test", run_id=running.run_id)
    second.join(timeout=120)
    assert not second.is_alive() and "error" not in second_out, second_out
    (run,) = second_out["result"]
    assert run["tis"]["query"]["state"] == "success", run
    out = run["xcoms"]["query"]
    assert out["run_id"] == running.run_id and out["state"] == "ENDED", out  # the same query, ended

    # One query ran through the sink: every source record once, including those after the kill.
    values = Counter(m.value().decode() for m in read_sink(kafka_config, sink))
    assert set(values) == {str(i) for i in range(50)} and all(n == 1 for n in values.values()), values
    with Ledger(ledger_url) as ledger:
        assert ledger.live_stream_run(name) is None


def _install_query_dag(
    airflow_env: Any,
    kafka_config: dict[str, Any],
    name: str,
    source: str,
    sink: str,
    ledger_url: str,
    **spec: Any,
) -> None:
    """Put the query DAG and its sink in the DAGs folder, the query's settings in the env."""
    full = {
        "name": name,
        "bootstrap": kafka_config["bootstrap.servers"],
        "source": source,
        "checkpoint": str(airflow_env.home / "checkpoint"),
        "max_offsets": 40,
        "sink_ref": "eo_ss_sinks:SINK",
        **spec,
    }
    airflow_env.env.update(
        EO_SS_NAME=name,
        EO_SS_BOOTSTRAP=kafka_config["bootstrap.servers"],
        EO_SS_SINK=sink,
        EO_SS_LEDGER_URL=ledger_url,
        EO_SS_STAGING=str(airflow_env.home / "ss-staging"),
        EO_SS_APP=str(TESTS / "eo_ss_query.py"),
        EO_SS_SPEC=json.dumps(full),
    )
    airflow_env.add_dag(TESTS / "eo_ss_sinks.py")
    airflow_env.add_dag(HERE / "dags" / "eo_ss_query_dag.py")
