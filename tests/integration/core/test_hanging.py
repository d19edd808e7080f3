"""Hanging transactions, found and ended: a committer stopped inside its transaction and
then killed leaves it open on the sink and on the marker group's ``__consumer_offsets``
partition; ``eo doctor`` names it (ours, with its age and the ledger's shard, listed with
Kafka's Java admin client), ``eo recover --abort-hanging`` ends it and commits the PREPARED
checkpoint by its markers. A foreign open transaction is named foreign and never touched.
Exactly-once is counted against the source (a read_committed consumer of the sink).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from eo_faultlib import kill_child, paused_commit
from eo_harness import Harness, parse_json_line, poll_until
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo import names
from airflow_provider_eo.core.hanging import default_admin
from airflow_provider_eo.core.recover import recover_pipeline
from airflow_provider_eo.kafka.admin import sink_offsets
from airflow_provider_eo.kafka.transactions import (
    JavaAdmin,
    ToolOutput,
    TransactionView,
    join_open_transactions,
)
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

FOREIGN = """
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
              "transaction.timeout.ms": 600000})
p.init_transactions(30)
p.begin_transaction()
p.produce(sys.argv[3], key=b"foreign", value=b"foreign", partition=int(sys.argv[4]))
p.flush(30)
print("open", flush=True)
sys.stdin.read()  # hold the transaction open until killed
"""


def _foreign(h: Harness, transactional_id: str, partition: int) -> None:
    """Another producer's transaction left open on one sink partition (killed, never ended)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            FOREIGN,
            h.config["bootstrap.servers"],
            transactional_id,
            h.pipeline.sink_topic,
            str(partition),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    proc.kill()
    proc.wait(timeout=30)


def _open_partitions(h: Harness, partitions: int) -> list[int]:
    stable, high = sink_offsets(h.config, h.pipeline.sink_topic, partitions)
    return [p for p in high if stable[p] < high[p]]


def _doctor(h: Harness) -> list[dict[str, str]]:
    proc = h.cli("doctor", "--no-spark-probe")
    return [f for f in parse_json_line(proc.stdout)["findings"] if f["check"] == "transactions"]


def _recover(h: Harness, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = h.cli("recover", *args)
    return proc.returncode, (parse_json_line(proc.stdout) if proc.stdout.strip() else {}), proc.stderr


def test_a_committer_stopped_in_its_transaction_then_killed_is_named_and_ended(
    harness: Callable[..., Harness],
) -> None:
    h = harness(sink_partitions=3)
    h.produce(60)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    # Stopped inside its transaction with every record and the marker sent, then killed.
    committer = paused_commit(h, "commit.before_end_txn")
    kill_child(committer)
    assert _open_partitions(h, 3), "the killed committer's transaction is open"
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED and cp.commit_plan is not None
    txn_id = names.plan_transactional_id(cp.commit_plan, h.pipeline.name, 0)
    group = cp.commit_plan.marker_group

    # 1. The doctor names it: ours, its transactional id, its age, and the marker group's
    #    __consumer_offsets partition among the partitions it holds. While the dead
    #    committer's lease runs it looks like a commit in progress, and says so.
    found = _doctor(h)
    ours = [f for f in found if f["found"].startswith("ours: ")]
    assert len(ours) == 1, found
    line = ours[0]["found"]
    assert repr(txn_id) in line and "open for " in line and h.pipeline.sink_topic in line, line
    assert "__consumer_offsets[" in line, f"the pending marker of {group} is not named: {line}"
    assert f"checkpoint {planned.checkpoint_id} is being committed by " in line, line
    # What its lease running out does: now it is a commit nobody holds.
    owner = h.ledger.get(h.pipeline.name, planned.checkpoint_id).commit_owner
    assert owner is not None
    h.ledger.release_commit_lease(h.pipeline.name, planned.checkpoint_id, owner=owner)
    (ours,) = [f for f in _doctor(h) if f["found"].startswith("ours: ")]
    assert ours["severity"] == "warn" and "--abort-hanging" in ours["change"], ours
    assert "no committer holds a live commit lease" in ours["found"], ours
    assert f"(checkpoint {planned.checkpoint_id} (PREPARED) shard 0 (PENDING))" in ours["found"], ours

    # 2. recover --abort-hanging ends it and commits the PREPARED checkpoint by its markers.
    rc, summary, err = _recover(h, "--abort-hanging")
    assert rc == 0, err
    assert summary["hanging"]["fenced"] == [txn_id] and not summary["hanging"]["foreign"], summary
    assert summary["committed"] == planned.checkpoint_id and not summary["open_after"], summary
    assert f"fenced {txn_id}" in err

    # 3. read_committed consumers move on: the last stable offset reaches the high watermark.
    assert poll_until(lambda: not _open_partitions(h, 3), timeout=30), _open_partitions(h, 3)
    # 4. Each source record once in the sink, nothing else.
    assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=60)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.COMMITTED
    assert not [f for f in _doctor(h) if f["severity"] != "ok"]


def test_a_foreign_open_transaction_is_named_foreign_and_left_alone(harness: Callable[..., Harness]) -> None:
    h = harness(sink_partitions=3)
    h.produce(30)
    h.drain()
    _foreign(h, "someone-else.0", partition=1)
    assert _open_partitions(h, 3) == [1]

    found = _doctor(h)
    assert [f["found"].split(",")[0] for f in found] == ["foreign: 'someone-else.0'"], found
    assert found[0]["severity"] == "warn" and "eo never ends it" in found[0]["change"]

    rc, summary, err = _recover(h, "--abort-hanging", "--wait", "1")
    assert rc == 1, err
    assert (
        summary["hanging"]["foreign"]
        and not summary["hanging"]["fenced"]
        and not summary["hanging"]["aborted"]
    )
    assert "'someone-else.0'" in " ".join(err.split()) and "left alone" in err
    assert _open_partitions(h, 3) == [1]  # untouched
    assert summary["committed"] is None and h.ledger.unfinished(h.pipeline.name) is None


class _CoordinatorForgot(JavaAdmin):
    """The real Java admin tool, except that no coordinator seems to hold any transaction:
    what a hanging transaction looks like (its coordinator finished or lost it while a
    partition never got its marker). Only the partition leaders' view is kept."""

    def list_open(self, config: Any, partitions: Any, *, owner: str, now_ms: int) -> TransactionView:
        view = super().list_open(config, partitions, owner=owner, now_ms=now_ms)
        leaders = ToolOutput(producers=tuple(p for t in view.transactions for p in t.producers))
        return join_open_transactions(leaders, partitions, now_ms=now_ms)


def test_a_hanging_transaction_of_ours_is_aborted_by_kip664(harness: Callable[..., Harness]) -> None:
    h = harness(sink_partitions=3)
    h.produce(45)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    kill_child(paused_commit(h, "commit.before_end_txn"))
    owner = h.ledger.get(h.pipeline.name, planned.checkpoint_id).commit_owner
    assert owner is not None
    h.ledger.release_commit_lease(h.pipeline.name, planned.checkpoint_id, owner=owner)
    assert _open_partitions(h, 3)
    real = default_admin()
    lines: list[str] = []

    result = recover_pipeline(
        h.pipeline,
        h.ledger,
        abort_hanging=True,
        admin=_CoordinatorForgot(real.java, real.classpath, real.timeout_s),
        progress=lines.append,
    )
    assert result.hanging is not None and not result.hanging.fenced and not result.hanging.foreign, lines
    # Every partition it held open, the sink's and the marker group's, got an abort marker.
    aborted = " ".join(result.hanging.aborted)
    assert all(f"{h.pipeline.sink_topic}[{p}]" in aborted for p in _held(result.hanging.found)), lines
    assert "__consumer_offsets[" in aborted, lines
    assert result.committed == planned.checkpoint_id and result.clean, result.summary()
    assert poll_until(lambda: not _open_partitions(h, 3), timeout=30)
    assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=45)


def _held(found: list[str]) -> list[int]:
    """The sink partitions the one hanging transaction listed held open."""
    (line,) = found
    return [int(p) for p in re.findall(r"sink-\w+\[(\d+)\]", line)]
