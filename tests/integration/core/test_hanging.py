"""Hanging transactions, found and ended: a committer stopped inside its transaction and
then killed leaves it open on the sink and on the marker group's ``__consumer_offsets``
partition; ``eo doctor`` names it (ours, with its age and the ledger's shard, listed with
Kafka's Java admin client), ``eo recover --abort-hanging`` ends it and commits the PREPARED
checkpoint by its markers. A foreign open transaction is named foreign and never touched.
Exactly-once is counted against the source (a read_committed consumer of the sink).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from eo_faultlib import kill_child
from eo_harness import Harness, parse_json_line, poll_until
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo import names
from airflow_provider_eo.kafka.admin import sink_offsets
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
    planned, committer = h.paused_commit()  # transaction open, every record and the marker sent
    kill_child(committer)
    assert _open_partitions(h, 3), "the killed committer's transaction is open"
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED and cp.commit_plan is not None
    txn_id = names.plan_transactional_id(cp.commit_plan, h.pipeline.name, 0)
    group = cp.commit_plan.marker_group

    # 1. The doctor names it: ours, its transactional id, its age, the ledger's shard, and the
    #    marker group's __consumer_offsets partition among the partitions it holds.
    found = _doctor(h)
    ours = [f for f in found if f["found"].startswith("ours: ")]
    assert len(ours) == 1, found
    line = ours[0]["found"]
    assert repr(txn_id) in line and "open for " in line and h.pipeline.sink_topic in line, line
    assert "__consumer_offsets[" in line, f"the pending marker of {group} is not named: {line}"
    assert f"checkpoint {planned.checkpoint_id} (PREPARED) shard 0 (PENDING)" in line, line
    assert ours[0]["severity"] == "warn" and "--abort-hanging" in ours[0]["change"], ours[0]

    # 2. recover --abort-hanging ends it (the dead committer's lease still runs: --force-live)
    #    and commits the PREPARED checkpoint by its markers.
    rc, summary, err = _recover(h, "--abort-hanging", "--force-live")
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
