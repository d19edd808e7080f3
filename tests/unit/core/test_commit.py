"""commit_checkpoint (core/commit.py) on a real SQLite ledger, real staged Parquet and a fake
Kafka: the ledger's part of each shard (lease, PENDING before begin, COMMITTED after), retries
after a crash, the missing-marker proof, and the staging checks.

Exactly-once is counted on the fake broker's committed output (what a ``read_committed``
consumer sees).
"""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from eo_fake_kafka import (
    FakeBroker,
    FakeClients,
    FakeProducer,
    fire_once,
    prepared_checkpoint,
)

from airflow_provider_eo import names
from airflow_provider_eo.core import commit as commit_module
from airflow_provider_eo.core import shard as shard_module
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.errors import NotPrepared, StagingError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import Actor, CheckpointState, CommitLeaseHeld, Ledger, RangeSpec, ShardState
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 2
SINK_PARTITIONS = 3
OUTPUT = {0: [b"a0", b"a1"], 1: [b"b0"], 2: [b"c0", b"c1", b"c2"]}  # shard 0: {0, 2}, shard 1: {1}


class Crash(BaseException):
    """The committer process dies here (nothing of it runs any more)."""


def crash_at(monkeypatch: pytest.MonkeyPatch, step: str, hit: int = 1) -> None:
    """The committer dies at the ``hit``-th time ``step`` is reached (like EO_FAULT=kill)."""
    seen = {"n": 0}

    def point(name: str) -> None:
        if name == step:
            seen["n"] += 1
            if seen["n"] == hit:
                raise Crash(step)

    monkeypatch.setattr(shard_module, "fault_point", point)


def everything_once(broker: FakeBroker) -> None:
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values


def test_commits_every_shard_once_and_records_it(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    result = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert (result.published, result.shards_skipped) == (6, 0)
    everything_once(broker)
    group = names.marker_group(pipeline)
    assert broker.mark(group, OUT, 0) == broker.mark(group, OUT, 1) == cp.checkpoint_id
    assert broker.mark(pipeline.group_id, "in", 0) == 10  # the checkpoint's end
    # the marker per shard; only the plan's last shard also moves the pipeline's group
    sent = [tid for tid, call in broker.calls if call == "send_offsets_to_transaction"]
    assert sent == ["eo.orders.0", "eo.orders.1", "eo.orders.1"]
    assert all(p.topic_max == pipeline.sink_max_message_bytes for p in broker.producers)
    rows = {s.shard: (s.state, s.records, s.transactional_id) for s in result.checkpoint.shards}
    assert rows == {
        0: (ShardState.COMMITTED, 5, "eo.orders.0"),
        1: (ShardState.COMMITTED, 1, "eo.orders.1"),
    }


def test_lease_and_pending_row_exist_before_begin_transaction(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """The missing-marker proof relies on it: a shard without a row never began a transaction."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    seen: list[tuple[str, Any, str | None]] = []

    def at_begin(producer: FakeProducer) -> None:
        shard = int(producer.transactional_id.rsplit(".", 1)[1])
        now = ledger.get("orders", cp.checkpoint_id)
        row = {s.shard: s.state for s in now.shards}.get(shard)
        seen.append((producer.transactional_id, row, now.commit_owner))

    broker.on_call["begin_transaction"] = at_begin
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, owner="me", clients=FakeClients(broker))
    assert seen == [("eo.orders.0", ShardState.PENDING, "me"), ("eo.orders.1", ShardState.PENDING, "me")]


def test_committing_a_committed_checkpoint_does_nothing(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    calls = len(broker.calls)
    again = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert again.note == "already COMMITTED" and again.published == 0
    assert len(broker.calls) == calls
    everything_once(broker)


def test_an_unprepared_checkpoint_is_refused(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    cp = ledger.plan("orders", [RangeSpec("in", 0, 0, 10)], commit_plan=names.commit_plan(pipeline, 3))
    with pytest.raises(NotPrepared, match="is PLANNED, not PREPARED"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.calls == []


def test_retry_after_a_crash_between_shards_publishes_only_the_rest(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    crash_at(monkeypatch, "commit.after_commit_txn")  # shard 0 committed in Kafka, not in the ledger
    with pytest.raises(Crash):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    after_crash = ledger.get("orders", cp.checkpoint_id)
    assert after_crash.state is CheckpointState.PREPARED
    assert [(s.shard, s.state) for s in after_crash.shards] == [(0, ShardState.PENDING)]
    monkeypatch.undo()
    monkeypatch.setattr(admin, "partition_count", lambda config, topic: broker.partitions[topic])

    result = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert (result.published, result.shards_skipped) == (1, 1)
    everything_once(broker)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert {s.shard: s.state for s in result.checkpoint.shards} == {
        0: ShardState.COMMITTED,
        1: ShardState.COMMITTED,
    }


def test_missing_marker_with_a_shard_row_reads_the_output_back(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 0 committed, the ledger missed it, then its marker expired: the committed
    output proves it, nothing is republished."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    crash_at(monkeypatch, "commit.after_commit_txn")
    with pytest.raises(Crash):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    broker.marks.clear()  # offsets.retention.minutes passed

    result = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.count("read_back") == 1  # shard 0 only: shard 1 has no row
    assert (result.published, result.shards_skipped) == (1, 1)
    everything_once(broker)


def test_missing_marker_without_a_shard_row_publishes_without_reading_back(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.count("read_back") == 0
    everything_once(broker)


def test_crash_with_an_open_transaction_is_fenced_by_the_retry(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer killed mid-produce leaves its transaction open; the retry's
    init_transactions aborts it, so its records never become visible."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    crash_at(monkeypatch, "commit.after_begin")
    with pytest.raises(Crash):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert FakeClients(broker).open_transactions(OUT) == {0: (0, 2)}
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    everything_once(broker)
    assert FakeClients(broker).open_transactions(OUT) == {}


def test_fault_points_sit_where_the_fault_tests_expect_them(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = dataclasses.replace(pipeline, commit_shards=1)
    cp = prepared_checkpoint(ledger, pipeline, {0: [b"x"], 2: [b"y"]}, sink_partitions=3)

    def point(step: str) -> None:
        broker.calls.append(("", step))

    def triggered(step: str) -> bool:
        broker.calls.append(("", step))
        return False

    monkeypatch.setattr(shard_module, "fault_point", point)
    monkeypatch.setattr(shard_module, "fault_triggered", triggered)
    monkeypatch.setattr(commit_module, "fault_point", point)
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert [call for _tid, call in broker.calls] == [
        # every shard's committed marker, once, before any producer (ledger behind sink?),
        # never waiting on an open transaction
        "committed_marks_unstable",
        "new_producer",
        "metadata",
        "metadata",
        "init_transactions",
        "committed_marks",
        "begin_transaction",
        "produce",
        "commit.after_begin",
        "produce",
        "commit.after_begin",
        "flush",
        "commit.before_commit_txn",
        "send_offsets_to_transaction",
        "send_offsets_to_transaction",
        "commit.before_end_txn",
        "commit.ambiguous_before",
        "commit_transaction",
        "commit.ambiguous_after",
        "commit.after_commit_txn",
        "commit.before_ledger",
    ]


@pytest.mark.parametrize("step", ["commit.ambiguous_before", "commit.ambiguous_after"])
def test_injected_ambiguous_commit_is_decided_by_the_marker(
    step: str, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ambiguous_before: nothing committed, the shard is redone; ambiguous_after: it was
    committed, the marker shows it and nothing is re-sent. Never an abort, never twice."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    triggered, fired = fire_once(step)

    monkeypatch.setattr(shard_module, "fault_triggered", triggered)
    result = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    everything_once(broker)
    assert fired == [step]
    assert broker.count("abort_transaction") == 0
    assert broker.count("init_transactions", "eo.orders.0") == 2  # re-init with a new producer
    if step == "commit.ambiguous_before":
        assert (result.published, result.shards_skipped) == (6, 0)
        assert broker.count("commit_transaction", "eo.orders.0") == 1
    else:
        assert (result.published, result.shards_skipped) == (1, 1)
        assert broker.count("begin_transaction", "eo.orders.0") == 1


def test_a_live_committers_lease_is_respected(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    """Two committers of one checkpoint with the owners production gives them: ``eo commit``
    is inside shard 0's transaction when an Airflow task's commit of the same checkpoint
    starts. The task is refused before it fences anything, naming the committer that holds
    the lease; that one is not disturbed and publishes everything once."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    task = Actor.here(dag_id="eo_orders", run_id="manual__1", task_id="commit", try_number=1)
    second: list[str] = []

    def task_commits_meanwhile(producer: FakeProducer) -> None:
        if second:
            return
        second.append("started")
        inits = broker.count("init_transactions")
        with pytest.raises(CommitLeaseHeld) as refused:
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, actor=task, clients=FakeClients(broker))
        second.append(str(refused.value))
        assert broker.count("init_transactions") == inits  # nothing fenced

    broker.on_call["begin_transaction"] = task_commits_meanwhile
    result = commit_checkpoint(
        pipeline, ledger, cp.checkpoint_id, actor=Actor.here(), clients=FakeClients(broker)
    )
    assert result.checkpoint.state is CheckpointState.COMMITTED
    everything_once(broker)
    holder = names.lease_owner(Actor.here())
    assert f"is being committed by {holder!r}" in second[1]
    assert "--force-live" in second[1]


def test_two_tries_of_one_task_do_not_share_the_lease(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """An Airflow try holds the lease (alive: this process); its next try is another committer
    and is refused while that lease is live, even in the same process."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    first = Actor.here(dag_id="eo_orders", run_id="manual__1", task_id="commit", try_number=1)
    second = Actor.here(dag_id="eo_orders", run_id="manual__1", task_id="commit", try_number=2)
    assert names.lease_owner(first) != names.lease_owner(second)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner=names.lease_owner(first), ttl_s=300)
    with pytest.raises(CommitLeaseHeld, match=r"eo_orders/manual__1/commit#1@"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, actor=second, clients=FakeClients(broker))
    assert broker.count("init_transactions") == broker.count("begin_transaction") == 0  # nothing fenced
    assert not ledger.get("orders", cp.checkpoint_id).shards
    # the same try (the same committer) goes on under its own lease
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, actor=first, clients=FakeClients(broker))
    everything_once(broker)


def test_a_corrupt_staged_file_aborts_the_checkpoint_safely(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    staged = Path(cp.staging_location or "") / "data" / "sink_partition=1" / "part-0.parquet"
    staged.write_bytes(staged.read_bytes() + b"!")
    with pytest.raises(StagingError, match=r"failed verification.*the checkpoint is ABORTED"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED
    # the abort fenced every shard id before it read the markers (then once more for its
    # abort marks); nothing was produced
    assert (
        broker.count("init_transactions", "eo.orders.0")
        == broker.count("init_transactions", "eo.orders.1")
        == 2
    )
    assert broker.count("produce") == 0 and broker.committed == []


def test_the_transactional_id_prefix_is_the_pinned_one(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    moved = dataclasses.replace(pipeline, transactional_id_prefix="other")
    with pytest.raises(Exception, match="prefix"):
        commit_checkpoint(moved, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.calls == []


def test_a_marker_past_the_checkpoint_means_an_older_ledger_and_is_refused(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Checkpoints commit in order, so a shard marker already at checkpoint 3 while this
    ledger commits checkpoint 1 means the ledger was restored from an older copy: the shard
    used to be skipped as published (its records lost). Now nothing is published."""
    from airflow_provider_eo.errors import LedgerBehindSink

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    identity = ledger.get_pipeline(pipeline.name).identity
    broker.marks[(names.marker_group(pipeline), OUT, 1)] = (3, names.marker_metadata(identity))
    with pytest.raises(LedgerBehindSink, match="shard 1 at checkpoint 3") as refused:
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert "the ledger is older than the sink" in str(refused.value)
    assert all(broker.visible(OUT, p) == 0 for p in range(SINK_PARTITIONS))
    assert broker.count("begin_transaction") == 0
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED


def test_a_manifest_not_visible_here_is_retried_never_aborted(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Absent is not corrupt: a commit run where the staging folder is not visible (another
    host, a relative staging_dir resolved elsewhere) used to abort the checkpoint; now it
    fails retryably, saying where it looked, and the checkpoint stays PREPARED."""
    from airflow_provider_eo.errors import StagingNotVisible

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    manifest = Path(cp.staging_location or "") / names.MANIFEST
    hidden = manifest.with_name("elsewhere.json")
    manifest.rename(hidden)
    with pytest.raises(StagingNotVisible, match="not visible from this process") as absent:
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert str(manifest) in str(absent.value) and "eo abort" in str(absent.value)
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED
    assert all(broker.visible(OUT, p) == 0 for p in range(SINK_PARTITIONS))
    hidden.rename(manifest)  # visible again (the commit runs where the folder is): published once
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert sorted(broker.values(OUT)) == sorted(v for vs in OUTPUT.values() for v in vs)


def test_a_marker_behind_an_open_transaction_is_read_up_front_without_waiting(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """A committed marker past the checkpoint on a shard whose transaction is open (a
    killed committer's: the sink and the marker group both hold its pending writes) is
    still read up front, committed offsets only (a stable read would wait for the broker
    to abort that transaction): refused before anything is produced."""
    from airflow_provider_eo.errors import LedgerBehindSink

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    identity = ledger.get_pipeline(pipeline.name).identity
    group = names.marker_group(pipeline)
    broker.marks[(group, OUT, 1)] = (3, names.marker_metadata(identity))
    clients = FakeClients(broker)
    killed = clients.producer("eo.orders.1", 10_000, None, None)
    killed.init_transactions(10)
    killed.begin_transaction()
    killed.produce(OUT, b"zombie", None, 1)
    killed.send_offsets_to_transaction(
        [TopicPartition(OUT, 1, 4, metadata=names.marker_metadata(identity))], group, 10
    )
    with pytest.raises(LedgerBehindSink, match="shard 1 at checkpoint 3"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=clients)
    assert broker.stable_waits == [] and broker.count("new_producer") == 1  # the killed one only
    assert broker.visible(OUT, 1) == 0
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED


def test_another_deployment_of_the_name_publishing_elsewhere_is_refused_before_anything(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Two ledgers planned their first checkpoint of one pipeline name before either had
    committed (so neither plan saw the other); the other one has since published to its own
    sink. This commit is refused before a producer exists (the two share transactional
    ids); a marker of this ledger's own identity on another topic (a changed sink) is not."""
    from airflow_provider_eo.errors import PipelineNameInUse

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    identity = ledger.get_pipeline(pipeline.name).identity
    group = names.marker_group(pipeline)
    broker.marks[(group, "old-sink", 0)] = (7, names.marker_metadata(identity))
    broker.marks[(group, "their-sink", 1)] = (1, names.marker_metadata("f" * 32))
    with pytest.raises(PipelineNameInUse, match="'their-sink'") as refused:
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert "f" * 32 in str(refused.value) and "old-sink" not in str(refused.value)
    assert broker.count("new_producer") == 0 and broker.count("begin_transaction") == 0
    assert all(broker.visible(OUT, p) == 0 for p in range(SINK_PARTITIONS))
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED

    del broker.marks[(group, "their-sink", 1)]  # that deployment retired, its markers deleted
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    everything_once(broker)


def test_a_clean_same_name_check_is_trusted_for_a_while_then_read_again(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the marker group's offsets on every partition of the cluster for each commit
    of a stream checkpointing every few seconds is too much: a clean answer holds for
    OTHER_DEPLOYMENTS_RECHECK_S; a deployment that appears meanwhile is refused once it has
    passed."""
    from airflow_provider_eo.core import sink_guard
    from airflow_provider_eo.errors import PipelineNameInUse

    clock = [1000.0]
    monkeypatch.setattr(sink_guard.time, "monotonic", lambda: clock[0])
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)
    broker.marks[(names.marker_group(pipeline), "their-sink", 0)] = (1, names.marker_metadata("e" * 32))

    clock[0] += sink_guard.OTHER_DEPLOYMENTS_RECHECK_S / 2  # within the window: not read again
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS, start=10)
    commit_checkpoint(pipeline, ledger, second.checkpoint_id, clients=clients)
    assert ledger.get(pipeline.name, second.checkpoint_id).state is CheckpointState.COMMITTED

    clock[0] += sink_guard.OTHER_DEPLOYMENTS_RECHECK_S  # past it: read, and refused
    third = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS, start=20)
    with pytest.raises(PipelineNameInUse, match="'their-sink'"):
        commit_checkpoint(pipeline, ledger, third.checkpoint_id, clients=clients)


def test_a_checkpoint_every_marker_shows_published_is_recorded_without_its_staging(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """A ledger restored from a copy taken while checkpoint N was PREPARED, after the newer
    ledger committed N and removed its staging: every shard's marker shows N, so nothing is
    left to publish and the ledger catches up (it used to fail with StagingNotVisible on every
    retry, and an abort is refused once a shard published: a wedge). One shard without the
    marker keeps the retryable refusal."""
    import shutil

    from airflow_provider_eo.errors import StagingNotVisible

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    shutil.rmtree(cp.staging_location or "")  # the newer ledger's cleanup
    plan = ledger.get(pipeline.name, cp.checkpoint_id).commit_plan
    assert plan is not None and plan.shards == 2
    shown = (cp.checkpoint_id, names.marker_metadata(ledger.get_pipeline(pipeline.name).identity))
    broker.marks[(names.marker_group(pipeline), OUT, 0)] = shown  # shard 0 published, shard 1 not
    with pytest.raises(StagingNotVisible):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    broker.marks[(names.marker_group(pipeline), OUT, 1)] = shown
    done = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert done.checkpoint.state is CheckpointState.COMMITTED and done.published == 0
    assert broker.count("begin_transaction") == 0  # nothing was sent
    rows = {r.shard: (r.state.value, r.records) for r in done.checkpoint.shards}
    assert rows == {0: ("COMMITTED", 5), 1: ("COMMITTED", 1)}


def test_a_marker_past_the_checkpoint_is_refused_before_the_staging_is_read(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """An older ledger's PREPARED checkpoint whose staging the newer ledger removed: the
    refusal names the real cause (LedgerBehindSink), not the missing staging (whose message
    would send the operator to `eo abort`, which the markers refuse)."""
    import shutil

    from airflow_provider_eo.errors import LedgerBehindSink

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    shutil.rmtree(cp.staging_location or "")
    identity = ledger.get_pipeline(pipeline.name).identity
    broker.marks[(names.marker_group(pipeline), OUT, 0)] = (
        cp.checkpoint_id + 2,
        names.marker_metadata(identity),
    )
    with pytest.raises(LedgerBehindSink, match="the ledger is older than the sink"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.count("new_producer") == 0


def test_the_early_marker_check_never_waits_on_a_killed_committers_open_transaction(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer killed inside shard 0's transaction after it sent the marker: the marker
    is a pending offset commit on the marker group's partition (out, 0), while the shard's
    records sit on sink partition 2 only (partition 0 has none in this checkpoint), so the
    sink shows no open transaction on partition 0. The retry's early check of every shard's
    marker must not wait for that transaction (a stable read waits until the broker aborts
    it, or gives up after 30 s); the shard's own fence aborts it, and each record is
    published once."""
    output = {1: [b"b0"], 2: [b"c0", b"c1"]}  # shard 0: partition 2 only; shard 1: partition 1
    cp = prepared_checkpoint(ledger, pipeline, output, sink_partitions=SINK_PARTITIONS)
    crash_at(monkeypatch, "commit.before_end_txn")
    with pytest.raises(Crash):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    group = names.marker_group(pipeline)
    assert broker.open_transactions_with_offsets(group, [(OUT, 0)])  # the marker is pending
    assert FakeClients(broker).open_transactions(OUT) == {2: (0, 2)}  # not on partition 0
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    done = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert broker.stable_waits == []  # no read waited on the killed committer's transaction
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert broker.values(OUT, 1) == [b"b0"] and broker.values(OUT, 2) == [b"c0", b"c1"]
    assert broker.count("broker_abort_timeout") == 0  # the fence aborted it, not its timeout


def _committed_meanwhile(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, cids: list[int]) -> None:
    """Another committer (a faster Airflow try, a stream) commits ``cids`` in order."""
    for cid in cids:
        commit_checkpoint(pipeline, ledger, cid, clients=FakeClients(broker))


@pytest.mark.parametrize("seen_at", ["early check", "shard fence"])
def test_a_slow_second_committer_of_a_checkpoint_committed_meanwhile_is_told_so(
    seen_at: str, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two committers of checkpoint 1; the other one commits 1 and then 2 while this one is
    slow (paused, a long GC, a slow ledger): this one then finds markers at checkpoint 2,
    past the one it commits. The ledger is not older than the sink (it shows 1 COMMITTED):
    the outcome is "already committed by another committer", a success that publishes
    nothing, never ``LedgerBehindSink`` (which sends an operator to look for a restored
    backup)."""
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS, start=10)
    clients = FakeClients(broker)
    if seen_at == "early check":
        read = clients.committed_marks

        def slow(*args: Any, **kwargs: Any) -> Any:
            clients.committed_marks = read  # type: ignore[method-assign]
            _committed_meanwhile(pipeline, ledger, broker, [first.checkpoint_id, second.checkpoint_id])
            return read(*args, **kwargs)

        clients.committed_marks = slow  # type: ignore[method-assign]
    else:

        def slow_fence(producer: FakeProducer) -> None:
            del broker.on_call["init_transactions"]
            _committed_meanwhile(pipeline, ledger, broker, [first.checkpoint_id, second.checkpoint_id])

        broker.on_call["init_transactions"] = slow_fence
    result = commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert result.by_another and result.published == 0
    assert result.note.startswith("already committed by another committer")
    assert result.summary()["note"] == result.note
    for p, values in OUTPUT.items():  # both checkpoints once each, nothing of this committer
        assert broker.values(OUT, p) == values * 2


def test_the_lease_of_a_committer_whose_process_is_gone_is_taken_over_at_once(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Another process of this machine holds the lease (e.g. an Airflow try, or a stream): while
    it runs, a commit here is refused naming it; once it was killed, the next commit (the
    task's retry on the same host, the restarted stream) takes the lease over at once instead
    of waiting for it to run out, and records from whom."""
    import signal
    import subprocess
    import sys

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=3)
    code = (
        "import time\n"
        "from airflow_provider_eo import names\n"
        "from airflow_provider_eo.ledger import Ledger\n"
        f"with Ledger({ledger.url!r}) as ledger:\n"
        f"    ledger.acquire_commit_lease('orders', {cp.checkpoint_id},\n"
        "                                owner=names.lease_owner(), ttl_s=300)\n"
        "print(names.lease_owner(), flush=True)\n"
        "time.sleep(300)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        holder = child.stdout.readline().strip()
        assert holder.startswith(f"commit:@{socket.gethostname()}:{child.pid}~"), holder
        with pytest.raises(CommitLeaseHeld, match=f"is being committed by {re.escape(repr(holder))}"):
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
        assert broker.count("init_transactions") == 0
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    result = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert result.checkpoint.state is CheckpointState.COMMITTED
    everything_once(broker)
    taken = [e for e in ledger.events("orders", cp.checkpoint_id) if e.kind == "lease"][-1]
    assert taken.details["previous_owner"] == holder and taken.details["previous_owner_gone"] is True
    assert taken.details["owner"] == names.lease_owner()


def test_a_commit_that_fails_gives_its_lease_up_for_the_retry(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails with an error (not a crash) publishes no more: its lease is given up,
    so the retry (the next Airflow try, in another process: another owner) is not refused for
    the lease's remaining minutes; it fences what the failed one left open."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)

    def fail(step: str) -> None:
        if step == "commit.before_commit_txn":
            raise RuntimeError("the task failed here")

    monkeypatch.setattr(shard_module, "fault_point", fail)
    with pytest.raises(RuntimeError):
        commit_checkpoint(
            pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker), owner="commit:try#1"
        )
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    done = commit_checkpoint(
        pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker), owner="commit:try#2"
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED
    everything_once(broker)
