"""abort_checkpoint (core/abort.py) on a real SQLite ledger and a fake Kafka: refused while a
live committer holds the lease or once a shard published, every shard id fenced before the
markers are read, idempotent. The interleavings with committers of other checkpoints are in
test_abort_safety.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from confluent_kafka import KafkaException
from eo_fake_kafka import FakeBroker, FakeClients, prepared_checkpoint

from airflow_provider_eo import names
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.fencing import fence_owner
from airflow_provider_eo.errors import AbortRefused, PipelineIdentityMismatch
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.publisher import ProducerLost
from airflow_provider_eo.ledger import Actor, CheckpointState, Ledger, RangeSpec, leases
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 2
SINK_PARTITIONS = 2
OUTPUT = {0: [b"a0"], 1: [b"b0", b"b1"]}
IDS = ["eo.orders.0", "eo.orders.1"]


def fenced_then_read(broker: FakeBroker) -> list[str]:
    """The abort's Kafka calls, shortened: ``fence <id>`` per init_transactions, ``read``."""
    out = []
    for tid, call in broker.calls:
        if call == "init_transactions":
            out.append(f"fence {tid}")
        elif call == "committed_marks":
            out.append("read")
    return out


def test_aborts_after_fencing_every_shard_then_reading_the_markers(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    done = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert done.state is CheckpointState.ABORTED and done.abort_reason == "test"
    # Then, per shard, the abort mark: fenced again, the marker and the mark read, the mark sent.
    marks = [c for tid in IDS for c in (f"fence {tid}", "read", "read")]
    assert fenced_then_read(broker) == ["fence eo.orders.0", "fence eo.orders.1", "read", "read", *marks]
    assert broker.count("commit_transaction") == 2 and broker.values(OUT) == []


def test_a_paused_committers_transaction_is_fenced_and_never_visible(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer produced its records and paused before send_offsets_to_transaction, its
    lease expired: the abort's fence aborts its transaction and refuses its commit."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner="eo.orders", ttl_s=60)
    clients = FakeClients(broker)
    paused = clients.producer("eo.orders.1", 10_000, None, None)
    paused.init_transactions(10)
    paused.begin_transaction()
    paused.produce(OUT, b"b0", None, 1)
    # It stays paused past its lease: the database's clock moves ten minutes on.
    real_now = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real_now(s) + dt.timedelta(minutes=10))

    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=clients)
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED
    with pytest.raises(KafkaException, match="FENCED"):
        paused.send_offsets_to_transaction([], names.marker_group(pipeline), 10)
    with pytest.raises(KafkaException, match="FENCED"):
        paused.commit_transaction(10)
    assert broker.committed == []


def test_refused_while_a_live_committer_holds_the_lease(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner="eo.orders", ttl_s=300)
    with pytest.raises(
        AbortRefused,
        match=r"while a live committer \('eo.orders', no shard recorded yet\) holds its commit lease: "
        r"checkpoint 1 is being committed by 'eo.orders' until .*; wait, or stop it first",
    ):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert broker.calls == []  # nothing fenced: the committer is alive
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED


def test_force_live_fences_the_lease_holder_and_aborts(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner="eo.orders", ttl_s=300)
    done = abort_checkpoint(
        pipeline, ledger, cp.checkpoint_id, reason="test", force_live=True, clients=FakeClients(broker)
    )
    assert done.state is CheckpointState.ABORTED
    assert fenced_then_read(broker)[:2] == ["fence eo.orders.0", "fence eo.orders.1"]


def test_the_abort_holds_the_lease_so_no_committer_begins(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """While the abort fences and reads, the lease is the abort's: a committer's lease check
    fails before it begins a transaction."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    owners: list[str | None] = []
    broker.on_call["init_transactions"] = lambda producer: owners.append(
        ledger.get("orders", cp.checkpoint_id).commit_owner
    )
    actor = Actor.here()
    abort_checkpoint(
        pipeline, ledger, cp.checkpoint_id, reason="test", actor=actor, clients=FakeClients(broker)
    )
    assert owners == [fence_owner(actor)] * 4  # the fence, then the abort marks


def test_refused_when_a_marker_shows_a_shard_published(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    identity = ledger.get_pipeline("orders").identity
    broker.marks[(names.marker_group(pipeline), OUT, 1)] = (cp.checkpoint_id, names.marker_metadata(identity))
    with pytest.raises(AbortRefused, match=r"test, but it cannot be aborted: .*shard 1 \(its commit marker"):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED
    # the markers were read only after every id was fenced: what they show is final
    assert fenced_then_read(broker) == ["fence eo.orders.0", "fence eo.orders.1", "read", "read"]


def test_an_older_marker_does_not_block_the_abort(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=FakeClients(broker))
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2, start=10)
    done = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert done.state is CheckpointState.ABORTED


def test_a_foreign_marker_is_refused(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    broker.marks[(names.marker_group(pipeline), OUT, 0)] = (7, names.marker_metadata("f" * 16))
    with pytest.raises(PipelineIdentityMismatch):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED


def test_is_idempotent(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    first = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    calls = len(broker.calls)
    again = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="other", clients=FakeClients(broker))
    assert again.state is CheckpointState.ABORTED and again.abort_reason == first.abort_reason == "test"
    assert len(broker.calls) == calls


def test_a_committed_checkpoint_is_refused(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    calls = len(broker.calls)
    with pytest.raises(AbortRefused, match="is COMMITTED"):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert len(broker.calls) == calls


def test_committed_while_taking_the_lease_is_decided_again(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    take = ledger.acquire_fence_lease

    def committed_meanwhile(*args: Any, **kwargs: Any) -> Any:
        # a committer finishes just before the abort takes its lease
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
        return take(*args, **kwargs)

    monkeypatch.setattr(ledger, "acquire_fence_lease", committed_meanwhile)
    with pytest.raises(AbortRefused, match="is COMMITTED"):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))


def test_an_earlier_unfinished_checkpoint_does_not_stop_the_abort(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """The earlier checkpoint has no live committer: the abort holds its lease too, fences and
    reads, and lets it go again."""
    prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    later = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2, start=10)
    done = abort_checkpoint(pipeline, ledger, later.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert done.state is CheckpointState.ABORTED
    assert fenced_then_read(broker)[:2] == ["fence eo.orders.0", "fence eo.orders.1"]
    earlier = ledger.get("orders", later.checkpoint_id - 1)
    assert earlier.state is CheckpointState.PREPARED and earlier.commit_lease_until is None


def test_a_planned_checkpoint_is_fenced_and_aborted(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = ledger.plan("orders", [RangeSpec("in", 0, 0, 10)], commit_plan=names.commit_plan(pipeline, 2))
    done = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert done.state is CheckpointState.ABORTED
    assert fenced_then_read(broker) == ["fence eo.orders.0", "fence eo.orders.1", "read", "read"]


def test_without_a_frozen_plan_the_ids_come_from_todays_settings(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = dataclasses.replace(pipeline, commit_shards=3)  # min(3, 2 partitions): 2 shards
    cp = prepared_checkpoint(ledger, wide, OUTPUT, sink_partitions=2, plan=False)
    monkeypatch.setattr(admin, "partition_count", lambda config, topic: pytest.fail("read through clients"))
    abort_checkpoint(wide, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert [line for line in fenced_then_read(broker) if line.startswith("fence")] == [
        "fence eo.orders.0",
        "fence eo.orders.1",
        "fence eo.orders.0",  # the abort marks
        "fence eo.orders.1",
    ]


def test_an_id_that_cannot_be_fenced_leaves_the_checkpoint_unchanged(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    broker.fail("init_transactions", None, ProducerLost("no answer"))
    with pytest.raises(
        AbortRefused, match=r"could not fence transactional id 'eo.orders.1'.*Retry the abort"
    ):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED
    assert "read" not in fenced_then_read(broker)
