"""Savepoints and stop/resume through the `eo` CLI on a real broker and Spark.

Every refused command exits non-zero naming the pipeline and changes nothing in the ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from eo_harness import EO, Child, wait_for
from sqlalchemy import select

from airflow_provider_eo.core.savepoint import take_savepoint
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.ledger.models import Base

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
REF = "eo_test_pipelines:from_env"
EXIT_STOPPED = 3


def snapshot(ledger: Ledger) -> dict[str, list[Any]]:
    """Every row of every ledger table, in a stable order."""
    with ledger.engine.connect() as conn:
        return {
            t.name: sorted((tuple(map(repr, row)) for row in conn.execute(select(t))), key=repr)
            for t in Base.metadata.sorted_tables
        }


def eo(h: Any, *args: str, wait: bool = True) -> Any:
    """``eo <args>`` in a child process; ``REF`` in ``args`` is the harness's pipeline."""
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    env.pop("EO_FAULT", None)
    if not wait:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed by the OS)
        return Child(subprocess.Popen([EO, *args], env=env, stdout=out, stderr=err), out, err)
    return subprocess.run([EO, *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def test_stop_while_prepared_then_commit_then_plan_is_refused(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(60)
    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    stop = eo(h, "stop", REF, "--reason", "maintenance", "--json")
    assert stop.returncode == 0, stop.stderr
    assert json.loads(stop.stdout.splitlines()[-1])["stopped"] is True
    # the in-flight checkpoint still commits
    assert h.commit(cp.checkpoint_id).checkpoint.state is CheckpointState.COMMITTED
    h.produce(20, start=60)
    before = snapshot(h.ledger)
    for command in ("plan", "run-once"):
        proc = eo(h, command, REF, "--json")
        assert proc.returncode == EXIT_STOPPED, (command, proc.stderr)
        assert h.pipeline.name in proc.stderr and "is stopped" in proc.stderr
        assert "maintenance" in proc.stderr and "eo resume" in proc.stderr
    assert snapshot(h.ledger) == before
    assert eo(h, "resume", REF).returncode == 0
    assert [e.kind for e in h.ledger.events(h.pipeline.name)][-1] == "resume"
    h.drain()
    h.assert_exactly_once(expected_records=80)


def test_savepoint_stop_wait_points_at_the_checkpoint_committed_during_the_wait(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(50)
    h.drain()
    h.produce(40, start=50)
    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    child = eo(
        h,
        "savepoint",
        "create",
        REF,
        "before-upgrade",
        "--note",
        "n",
        "--stop",
        "--wait",
        "120",
        "--json",
        wait=False,
    )

    def waiting() -> bool:
        err = child.files[1]
        err.seek(0)
        return f"waiting for checkpoint {cp.checkpoint_id} (PREPARED)".encode() in err.read()

    wait_for(waiting, "the savepoint to wait for the prepared checkpoint", child=child)
    # stop first, then the wait: the pipeline is already stopped while the savepoint waits
    assert h.ledger.get_pipeline(h.pipeline.name).stopped
    h.commit(cp.checkpoint_id)  # committed by another process during the wait
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err.decode()[-3000:]
    sp = json.loads(out.decode().splitlines()[-1])
    committed = h.ledger.get(h.pipeline.name, cp.checkpoint_id)
    assert sp["checkpoint_id"] == cp.checkpoint_id
    assert sp["offsets"] == {t: {str(p): o for p, o in ps.items()} for t, ps in committed.end_offsets.items()}
    assert "@" in sp["created_by"] and sp["note"] == "n"
    assert eo(h, "plan", REF).returncode == EXIT_STOPPED
    listed = eo(h, "savepoint", "list", REF, "--json")
    assert [s["name"] for s in json.loads(listed.stdout.splitlines()[-1])] == ["before-upgrade"]
    table = eo(h, "savepoint", "list", REF)
    assert "before-upgrade" in table.stdout
    h.assert_exactly_once(expected_records=90)


def test_savepoint_while_live_commits_continue_points_at_the_in_flight_one(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(30)
    h.drain()
    h.produce(30, start=30)
    in_flight = h.plan()
    h.prepare(in_flight.checkpoint_id)
    later: list[int] = []

    def progress(cp: Any, waited: float, wait_s: float) -> None:
        if later:
            return
        # while the savepoint waits: the in-flight one commits, then a whole later cycle
        h.commit(in_flight.checkpoint_id)
        h.produce(30, start=60)
        later.append(h.run_once().checkpoint.checkpoint_id)

    sp = take_savepoint(h.pipeline, h.ledger, "live", poll_s=0.05, progress=progress)
    assert later == [in_flight.checkpoint_id + 1]
    assert sp.checkpoint_id == in_flight.checkpoint_id
    assert sp.offsets == h.ledger.get(h.pipeline.name, in_flight.checkpoint_id).end_offsets
    h.assert_exactly_once(expected_records=90)


def test_every_refusal_exits_non_zero_names_the_pipeline_and_changes_nothing(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=2, sink_partitions=1)
    name = h.pipeline.name
    h.ledger.ensure_pipeline(name, h.pipeline.fingerprint())  # registered, nothing committed

    def refused(*args: str, says: str, who: str = name, target: Any = h) -> None:
        before = snapshot(h.ledger)
        proc = eo(target, *args)
        assert proc.returncode not in (0, EXIT_STOPPED), (args, proc.stdout, proc.stderr)
        message = " ".join(proc.stderr.split())
        assert who in message and says in message, (args, message)
        assert snapshot(h.ledger) == before, args

    refused("savepoint", "create", REF, "sp", "--stop", says="no COMMITTED checkpoint yet")
    h.produce(40)
    h.drain()
    refused("reset", REF, "--to", "yesterday", says="earliest, latest, timestamp=")
    refused("reset", REF, "--to", 'offsets={"nope": {"0": 1}}', says="not a partition of its source topics")
    refused(
        "reset",
        REF,
        "--to",
        "offsets=" + json.dumps({h.pipeline.source_topics[0]: {"0": 10**9}}),
        says="above the log end",
    )
    refused("restore", REF, "--savepoint", "missing", says="has no savepoint 'missing'")
    refused("savepoint", "delete", REF, "missing", says="has no savepoint 'missing'")
    assert eo(h, "savepoint", "create", REF, "sp").returncode == 0
    refused("savepoint", "create", REF, "sp", "--stop", says="savepoint 'sp' already exists")
    h.produce(10, start=40)
    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    refused("restore", REF, "--savepoint", "sp", says=f"checkpoint {cp.checkpoint_id} is PREPARED")
    refused("reset", REF, "--to", "earliest", says=f"checkpoint {cp.checkpoint_id} is PREPARED")
    other = h.with_(name="no-such-pipeline")
    for args in (
        ("savepoint", "create", REF, "sp"),
        ("savepoint", "list", REF),
        ("savepoint", "delete", REF, "sp"),
        ("restore", REF, "--savepoint", "sp"),
        ("reset", REF, "--to", "latest"),
        ("stop", REF),
        ("resume", REF),
    ):
        refused(*args, says="is not in the ledger", who="no-such-pipeline", target=other)
    other.ledger.close()
