"""Whose an open transaction is, and how ``--abort-hanging`` ends ours (pure: listed
transactions in, fences and aborts out)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from airflow_provider_eo.core.hanging import (
    Attributed,
    PipelineTransactions,
    attribute,
    end_hanging,
    group_partition,
    is_ours_by_id,
    java_string_hash,
)
from airflow_provider_eo.errors import RecoverError
from airflow_provider_eo.kafka.transactions import OpenTransaction, PartitionProducer
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, CommitPlan
from airflow_provider_eo.ledger.records import ShardRecord
from airflow_provider_eo.ledger.states import ShardState
from airflow_provider_eo.pipeline import Pipeline

NOW_MS = 1_800_000_000_000
NOW = dt.datetime.fromtimestamp(NOW_MS / 1000, dt.UTC)


def test_java_string_hash_and_the_groups_offsets_partition() -> None:
    # Values printed by Java's String.hashCode.
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("eo-marker.orders") == -1881986250
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert java_string_hash("é😀") == 1996812  # UTF-16 units, a surrogate pair included
    assert group_partition("eo-marker.orders", 50) == 1881986250 % 50
    assert group_partition("polygenelubricants", 50) == 0  # Kafka's Utils.abs(MIN_VALUE) is 0


def test_ours_by_id() -> None:
    ns = ["eo.orders."]
    assert is_ours_by_id("eo.orders.0", namespaces=ns, known_ids=[])
    assert is_ours_by_id("eo.orders.12", namespaces=ns, known_ids=[])
    assert is_ours_by_id("old.orders.3", namespaces=ns, known_ids=["old.orders.3"])
    for foreign in ("eo.orders.x", "eo.orders.", "eo.orders2.0", "eo.orders.0.1", "someone-else.0"):
        assert not is_ours_by_id(foreign, namespaces=ns, known_ids=[]), foreign


def _shard(shard: int, state: ShardState, tid: str = "eo.p.0") -> ShardRecord:
    return ShardRecord(shard, tid, None, None, state, 10, NOW)


def _cp(cid: int, state: CheckpointState, *shards: ShardRecord) -> CheckpointRecord:
    plan = CommitPlan(
        sink_topic="out",
        sink_partitions=2,
        transactional_id_prefix="eo",
        marker_group="eo-marker.p",
        shard_of_partition=(0, 1),
    )
    return CheckpointRecord(
        pipeline="p",
        checkpoint_id=cid,
        state=state,
        lineage=1,
        ranges=(),
        planned_at=NOW,
        shards=shards,
        commit_plan=plan,
    )


def _producer(pid: int, epoch: int, partition: int = 0) -> PartitionProducer:
    return PartitionProducer("out", partition, pid, epoch, None, 5 + partition, NOW_MS - 30_000)


def _txn(tid: str | None, pid: int, epoch: int, *partitions: int) -> OpenTransaction:
    parts = partitions or (0,)
    return OpenTransaction(
        pid,
        epoch,
        tid,
        "ONGOING" if tid else None,
        NOW_MS - 20_000 if tid else None,
        60_000 if tid else None,
        tuple(("out", p) for p in parts),
        tuple(_producer(pid, epoch, p) for p in parts),
    )


CHECKPOINTS = [
    _cp(
        4,
        CheckpointState.COMMITTED,
        _shard(0, ShardState.COMMITTED),
        _shard(1, ShardState.COMMITTED, "eo.p.1"),
    ),
    _cp(5, CheckpointState.PREPARED, _shard(0, ShardState.PENDING)),
]
#: What the first record each hanging transaction holds open names (its eo.prov header).
FIRST_RECORDS = {("out", 1, 6): ("p", 4), ("out", 0, 5): ("p", 5), ("out", 0, 7): ("other", 9)}


def _attribute(*txns: OpenTransaction, first: dict[Any, Any] | None = None) -> tuple[Attributed, ...]:
    return attribute(
        txns,
        pipeline="p",
        namespaces=["eo.p."],
        known_ids=["eo.p.0", "eo.p.1"],
        checkpoints=CHECKPOINTS,
        first_records=FIRST_RECORDS if first is None else first,
    )


def test_attribution_by_id_then_by_the_records_a_hanging_one_holds() -> None:
    got = _attribute(
        _txn("eo.p.0", 7, 3),  # ours by id; the newest row of its id: checkpoint 5
        _txn("someone-else.0", 99, 0),  # foreign
        _txn(None, 8, 1, 1),  # hanging; its first record on out[1] is checkpoint 4's
        _txn(None, 42, 0, 3),  # hanging; no record of ours read: foreign
    )
    assert [a.ours for a in got] == [True, False, True, False]
    assert (
        got[0].origin is not None and got[0].origin.describe() == "checkpoint 5 (PREPARED) shard 0 (PENDING)"
    )
    assert (
        got[2].origin is not None
        and got[2].origin.describe() == "checkpoint 4 (COMMITTED) shard 1 (COMMITTED)"
    )
    assert got[1].origin is None and got[3].origin is None
    assert got[0].describe(NOW_MS).startswith("ours: 'eo.p.0', producer 7/3, ONGOING on out[0], open for 20s")
    assert got[1].describe(NOW_MS).startswith("foreign: 'someone-else.0'")
    assert "(hanging: no coordinator holds it)" in got[2].describe(NOW_MS)
    # Another pipeline's records in a hanging transaction: not ours.
    other = OpenTransaction(
        9, 0, None, None, None, None, (("out", 0),), (PartitionProducer("out", 0, 9, 0, None, 7, 0),)
    )
    assert not _attribute(other)[0].ours
    # Another group's transactional offsets on the marker group's __consumer_offsets
    # partition: not our concern, left out; ours there are kept.
    offsets_only = OpenTransaction(5, 0, "app.0", "ONGOING", NOW_MS, 60_000, (("__consumer_offsets", 3),))
    assert _attribute(offsets_only) == ()
    ours_there = OpenTransaction(5, 0, "eo.p.1", "ONGOING", NOW_MS, 60_000, (("__consumer_offsets", 3),))
    assert [a.ours for a in _attribute(ours_there)] == [True]


class _Calls:
    def __init__(self) -> None:
        self.fenced: list[str] = []
        self.aborted: list[tuple[str, int, int]] = []
        self.renewals = 0

    def kw(self) -> dict[str, Any]:
        return {
            "fence_ids": self.fenced.extend,
            "abort_marker": lambda p: self.aborted.append((p.topic, p.partition, p.producer_id)),
            "renew": self._renew,
            "say": lambda _line: None,
        }

    def _renew(self) -> None:
        self.renewals += 1


PIPELINE = Pipeline(
    name="p", kafka={"bootstrap.servers": "b:1"}, source_topics=["in"], sink_topic="out", transform="m:f"
)


def _listed(*txns: OpenTransaction) -> PipelineTransactions:
    got = _attribute(*txns)
    return PipelineTransactions((("out", 0), ("out", 1)), got, (), NOW_MS)


def test_ours_are_fenced_by_id_hanging_ones_aborted_by_marker_foreign_ones_left() -> None:
    calls = _Calls()
    result = end_hanging(
        PIPELINE,
        # Producer 7's hanging transaction holds checkpoint 5's records: PENDING, never committed.
        _listed(_txn("eo.p.0", 7, 3), _txn("someone-else.0", 99, 0), _txn(None, 7, 4, 0, 1)),
        **calls.kw(),
    )
    assert calls.fenced == ["eo.p.0"] and result.fenced == ["eo.p.0"]
    # Aborted on each partition it holds, the lease renewed before each.
    assert calls.aborted == [("out", 0, 7), ("out", 1, 7)] and calls.renewals == 2
    assert len(result.aborted) == 2 and len(result.foreign) == 1 and len(result.found) == 3


def test_a_hanging_transaction_of_a_committed_shard_is_never_aborted() -> None:
    calls = _Calls()
    # Its records are checkpoint 4 shard 1's, which the ledger records COMMITTED: it may be
    # that committed transaction, its commit marker never written to this partition; an
    # abort marker would drop committed records.
    with pytest.raises(RecoverError, match=r"checkpoint 4 \(COMMITTED\) shard 1 \(COMMITTED\)") as err:
        end_hanging(PIPELINE, _listed(_txn(None, 8, 1, 1), _txn("eo.p.0", 7, 3)), **calls.kw())
    assert calls.aborted == [] and calls.fenced == ["eo.p.0"]  # the others still ended
    assert "would drop committed records" in str(err.value)
