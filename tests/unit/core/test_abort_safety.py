"""An abort (and ``eo recover``) is safe against every committer of the pipeline, each
interleaving driven deterministically on a real SQLite ledger and the fake broker:

- a committer cannot publish the aborted checkpoint between the abort's marker read and its
  ledger transition (the abort holds the commit lease of every unfinished checkpoint, and the
  transition is refused once a committer took it over);
- the abort's lease is renewed while it fences (between shard ids and during a long
  ``init_transactions``), never held for a fixed time;
- fencing never kills the live committer of another checkpoint: the transactional ids are one
  per commit shard, shared by all checkpoints, so the abort and the recovery refuse instead.

Exactly-once is counted on what the fake broker's ``read_committed`` view holds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, FakeProducer, prepared_checkpoint, write_staged

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.recover import recover_pipeline
from airflow_provider_eo.errors import AbortRefused, RecoverError
from airflow_provider_eo.kafka.publisher import offsets
from airflow_provider_eo.ledger import (
    CheckpointRecord,
    CheckpointState,
    CommitLeaseHeld,
    Ledger,
    RangeSpec,
    leases,
)
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 2
SINK_PARTITIONS = 2
OUTPUT = {0: [b"a0"], 1: [b"b0", b"b1"]}
COMMITTER = "commit:eo_orders/run/commit#1@worker:4242~"  # another process's committer


class Crash(BaseException):
    """The committer process dies here."""


class MarkerHook(FakeClients):
    """Fake clients that run ``hook`` once, right after the ``at``-th commit marker read."""

    def __init__(self, broker: FakeBroker, hook: Callable[[], None], *, at: int = 1) -> None:
        super().__init__(broker)
        self.hook = hook
        self.at = at
        self.reads = 0

    def committed_marks(
        self, group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        found = super().committed_marks(group, partitions, stable=stable)
        self.reads += 1
        if self.reads == self.at:
            self.hook()
        return found


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[dt.timedelta]:
    """How far the database's clock is moved on (append to move it further)."""
    moved = [dt.timedelta(0)]
    real = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real(s) + sum(moved, dt.timedelta(0)))
    return moved


def crash_before_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next commit dies after its Kafka transactions committed, before the ledger heard."""
    from airflow_provider_eo.core import commit as commit_module

    armed = [True]

    def point(step: str) -> None:
        if step == "commit.before_ledger" and armed:
            armed.clear()
            raise Crash(step)

    monkeypatch.setattr(commit_module, "fault_point", point)


def published_of(broker: FakeBroker, ledger: Ledger) -> dict[int, tuple[CheckpointState, int]]:
    """Checkpoint -> (its ledger state, how many of its records a read_committed consumer sees)."""
    counts: dict[int, int] = {}
    for record in broker.committed:
        found = record.checkpoint
        assert found is not None
        counts[found[0]] = counts.get(found[0], 0) + 1
    return {cid: (ledger.get("orders", cid).state, n) for cid, n in sorted(counts.items())}


def live_committer(
    ledger: Ledger, clients: FakeClients, checkpoint_id: int, *, ttl_s: float = 300
) -> FakeProducer:
    """The committer of ``checkpoint_id`` as it is between ``begin_transaction`` and
    ``send_offsets_to_transaction``: lease held, shard 0 PENDING, its records produced into an
    open transaction under ``eo.orders.0``."""
    ledger.acquire_commit_lease("orders", checkpoint_id, owner=COMMITTER, ttl_s=ttl_s)
    ledger.record_shard(
        "orders",
        checkpoint_id,
        0,
        transactional_id="eo.orders.0",
        producer_id=None,
        producer_epoch=None,
        state="PENDING",
        records=1,
    )
    producer = clients.producer("eo.orders.0", 10_000, None, None)
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(OUT, b"a0", None, 0)
    return producer


def finish(producer: FakeProducer, pipeline: Pipeline, checkpoint_id: int) -> None:
    """The paused committer resumes: marker, commit (raises FENCED when it was fenced)."""
    marker = offsets({(OUT, 0): checkpoint_id}, "")
    producer.send_offsets_to_transaction(marker, names.marker_group(pipeline), 10)
    producer.commit_transaction(10)


# -- a committer between the marker read and the transition ----------------------------------


def test_a_later_checkpoint_cannot_be_committed_between_the_marker_read_and_the_abort(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abort of checkpoint 2 while 1 is unfinished. Right after the abort read the markers, a
    committer commits 1, then 2, and dies before recording 2 in the ledger. Were the abort to
    go on, 2 would be ABORTED with its output published, and its range published again."""
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2, start=10)
    committers: list[str] = []

    def commit_both() -> None:
        clients = FakeClients(broker)
        try:
            commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)
            crash_before_ledger(monkeypatch)
            commit_checkpoint(pipeline, ledger, second.checkpoint_id, clients=clients)
        except (Exception, Crash) as exc:
            committers.append(type(exc).__name__)

    try:
        abort_checkpoint(
            pipeline,
            ledger,
            second.checkpoint_id,
            reason="test",
            clients=MarkerHook(broker, commit_both, at=SHARDS),  # after the last marker read
        )
    except AbortRefused as exc:
        committers.append(f"abort refused: {exc}")
    # No checkpoint is ABORTED with records visible (its range would be published again).
    published = published_of(broker, ledger)
    assert all(state is not CheckpointState.ABORTED for state, _n in published.values()), published
    # What happened: the abort held both leases, so the committer could not begin.
    assert committers == ["CommitLeaseHeld"]
    assert published == {}
    assert ledger.get("orders", second.checkpoint_id).state is CheckpointState.ABORTED
    assert ledger.get("orders", first.checkpoint_id).state is CheckpointState.PREPARED
    # The abort let go of checkpoint 1: its committer goes on at once, exactly once.
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=FakeClients(broker))
    assert published_of(broker, ledger) == {first.checkpoint_id: (CheckpointState.COMMITTED, 3)}


def planned_with_staging(ledger: Ledger, pipeline: Pipeline) -> tuple[CheckpointRecord, Callable[[], None]]:
    """A PLANNED checkpoint whose prepare has written its output, and the call that marks it
    PREPARED (what the prepare's driver does last)."""
    cp = ledger.plan("orders", [RangeSpec("in", 0, 0, 10)], commit_plan=names.commit_plan(pipeline, 2))
    root = names.attempt_dir(pipeline, cp.checkpoint_id, "a1")
    files = {p: [write_staged(Path(root), p, values)] for p, values in OUTPUT.items()}
    manifest = staging.Manifest(
        pipeline="orders",
        checkpoint_id=cp.checkpoint_id,
        attempt="a1",
        sink_topic=OUT,
        sink_partitions=2,
        files=files,
        records_read=10,
        ranges=[],
    )
    staging.write_manifest(root, manifest)

    def mark_prepared() -> None:
        ledger.mark_prepared(
            "orders",
            cp.checkpoint_id,
            attempt="a1",
            staging_location=root,
            records=manifest.records,
            bytes_=manifest.bytes,
            shard_counts={0: 1, 1: 2},
        )

    return cp, mark_prepared


def test_a_planned_checkpoint_cannot_be_prepared_and_published_during_its_abort(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp, mark_prepared = planned_with_staging(ledger, pipeline)
    committers: list[str] = []

    def prepare_and_commit() -> None:
        mark_prepared()
        crash_before_ledger(monkeypatch)
        try:
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
        except (Exception, Crash) as exc:
            committers.append(type(exc).__name__)

    try:
        abort_checkpoint(
            pipeline,
            ledger,
            cp.checkpoint_id,
            reason="test",
            clients=MarkerHook(broker, prepare_and_commit, at=SHARDS),
        )
    except AbortRefused as exc:
        committers.append(f"abort refused: {exc}")
    published = published_of(broker, ledger)
    assert all(state is not CheckpointState.ABORTED for state, _n in published.values()), published
    assert committers == ["CommitLeaseHeld"] and published == {}
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED


def test_a_committer_that_took_the_lease_over_after_the_marker_read_stops_the_abort(
    pipeline: Pipeline,
    ledger: Ledger,
    broker: FakeBroker,
    monkeypatch: pytest.MonkeyPatch,
    clock: list[dt.timedelta],
) -> None:
    """The abort stalls past its lease right after reading the markers; a committer takes the
    lease over, publishes and dies before the ledger heard. The transition is refused."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)

    def stall_then_commit() -> None:
        clock.append(dt.timedelta(minutes=10))  # the abort is paused; its lease runs out
        crash_before_ledger(monkeypatch)
        try:
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
        except Crash:
            pass

    clients = MarkerHook(broker, stall_then_commit, at=SHARDS)  # after the last marker read
    with pytest.raises(AbortRefused, match=f"{names.lease_owner()!r}"):  # this process's committer
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=clients)
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED
    assert published_of(broker, ledger) == {cp.checkpoint_id: (CheckpointState.PREPARED, 3)}
    # The commit's retry records what Kafka shows; nothing is published twice.
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    assert published_of(broker, ledger) == {cp.checkpoint_id: (CheckpointState.COMMITTED, 3)}


# -- the abort's lease is renewed while it fences -----------------------------------------------


def committer_tries(ledger: Ledger, checkpoint_id: int, outcomes: list[str]) -> None:
    try:
        ledger.acquire_commit_lease("orders", checkpoint_id, owner=COMMITTER, ttl_s=60)
        outcomes.append("leased")
    except CommitLeaseHeld:
        outcomes.append("refused")


def test_the_abort_lease_is_renewed_between_shard_ids(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: list[dt.timedelta]
) -> None:
    """Fencing the first id takes ten minutes (longer than any fixed lease): before the next id
    the lease is renewed, so a committer still cannot begin."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    outcomes: list[str] = []

    def slow_fence(producer: FakeProducer) -> None:
        if producer.transactional_id == "eo.orders.0":
            clock.append(dt.timedelta(minutes=10))
        else:
            committer_tries(ledger, cp.checkpoint_id, outcomes)

    broker.on_call["init_transactions"] = slow_fence
    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert outcomes == ["refused", "refused"]  # fencing it, then leaving its abort mark
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED


def test_the_abort_lease_is_renewed_during_a_long_init_transactions(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: list[dt.timedelta]
) -> None:
    """One ``init_transactions`` outlasts the lease: the heartbeat renews it meanwhile."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    outcomes: list[str] = []

    def hangs_past_the_lease(producer: FakeProducer) -> None:
        if producer.transactional_id != "eo.orders.1" or outcomes:  # its fence, not its abort mark
            return
        clock.append(dt.timedelta(minutes=10))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the broker answers once the heartbeat renewed it
            until = ledger.get("orders", cp.checkpoint_id).commit_lease_until
            if until is not None and until > dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=9):
                break
            time.sleep(0.05)
        committer_tries(ledger, cp.checkpoint_id, outcomes)

    broker.on_call["init_transactions"] = hangs_past_the_lease
    abort_checkpoint(
        pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker), lease_ttl_s=3.0
    )
    assert outcomes == ["refused"]
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED


def test_an_abort_whose_lease_was_taken_over_while_it_fenced_stops(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: list[dt.timedelta]
) -> None:
    """The abort stalled past its lease and a committer took it over: the next heartbeat finds
    the lease lost and the abort stops before reading any marker."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    outcomes: list[str] = []

    def stalled(producer: FakeProducer) -> None:
        if producer.transactional_id == "eo.orders.0":
            clock.append(dt.timedelta(minutes=10))
            committer_tries(ledger, cp.checkpoint_id, outcomes)

    broker.on_call["init_transactions"] = stalled
    with pytest.raises(
        AbortRefused, match=f"checkpoint {cp.checkpoint_id} is being committed by {COMMITTER!r}"
    ) as refused:
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert "--force-live" not in str(refused.value)  # that committer just took the lease: alive
    assert outcomes == ["leased"]
    assert broker.count("init_transactions") == 1 and broker.count("committed_marks") == 0
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED


# -- fencing never kills the live committer of another checkpoint -----------------------------


def test_aborting_a_later_checkpoint_leaves_the_live_committer_of_an_earlier_one_alone(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2, start=10)
    committer = live_committer(ledger, clients, first.checkpoint_id)
    with pytest.raises(AbortRefused) as refused:
        abort_checkpoint(pipeline, ledger, second.checkpoint_id, reason="test", clients=clients)
    message = str(refused.value)
    assert f"checkpoint {first.checkpoint_id} is being committed by {COMMITTER!r} until " in message
    assert "wait, or stop it first" in message and f"checkpoint {second.checkpoint_id}" in message
    assert broker.count("init_transactions") == 1  # the committer's own: nothing was fenced
    assert ledger.get("orders", second.checkpoint_id).state is CheckpointState.PREPARED
    finish(committer, pipeline, first.checkpoint_id)  # not fenced: it commits
    assert broker.values(OUT, 0) == [b"a0"]


def test_recover_leaves_a_live_committer_alone(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    committer = live_committer(ledger, clients, cp.checkpoint_id)
    with pytest.raises(RecoverError) as refused:
        recover_pipeline(pipeline, ledger, wait_s=0, clients=clients)
    message = str(refused.value)
    assert f"checkpoint {cp.checkpoint_id} is being committed by {COMMITTER!r} until " in message
    assert "wait, or stop it first" in message
    assert broker.count("init_transactions") == 1  # nothing fenced, nothing committed
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED
    finish(committer, pipeline, cp.checkpoint_id)
    assert broker.values(OUT, 0) == [b"a0"]


def test_recover_with_force_live_fences_the_lease_holder(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """A committer known to be dead while its lease runs: ``force_live`` fences and commits."""
    clients = FakeClients(broker)
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    committer = live_committer(ledger, clients, cp.checkpoint_id)
    result = recover_pipeline(pipeline, ledger, wait_s=0, clients=clients, force_live=True)
    assert result.committed == cp.checkpoint_id and result.published == 3
    assert not committer.pending and broker.values(OUT) == [b"a0", b"b0", b"b1"]


def test_once_the_earlier_committer_is_gone_the_abort_fences_and_aborts(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: list[dt.timedelta]
) -> None:
    """The earlier checkpoint's committer paused past its lease (a zombie): now the abort of
    the later checkpoint fences it, and none of its records become visible."""
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2, start=10)
    zombie = live_committer(ledger, clients, first.checkpoint_id, ttl_s=60)
    clock.append(dt.timedelta(minutes=10))
    done = abort_checkpoint(pipeline, ledger, second.checkpoint_id, reason="test", clients=clients)
    assert done.state is CheckpointState.ABORTED
    with pytest.raises(Exception, match="FENCED"):
        finish(zombie, pipeline, first.checkpoint_id)
    assert broker.committed == []
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)
    assert published_of(broker, ledger) == {first.checkpoint_id: (CheckpointState.COMMITTED, 3)}


def test_recover_holds_the_pipeline_while_it_fences_its_other_ids(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """While ``eo recover`` fences ids of finished checkpoints, no committer of the PREPARED
    one can begin (it would be fenced by the next id)."""
    narrow = dataclasses.replace(pipeline, commit_shards=1)
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)  # ids .0 .1
    second = ledger.plan("orders", [RangeSpec("in", 0, 10, 20)], commit_plan=names.commit_plan(narrow, 2))
    outcomes: list[str] = []

    def committer_during_the_fence(producer: FakeProducer) -> None:
        if producer.transactional_id == "eo.orders.1" and not outcomes:
            ledger.mark_prepared(
                "orders",
                second.checkpoint_id,
                attempt="a",
                staging_location="/nowhere",
                records=0,
                bytes_=0,
                shard_counts={},
            )
            committer_tries(ledger, second.checkpoint_id, outcomes)

    broker.on_call["init_transactions"] = committer_during_the_fence
    result = recover_pipeline(narrow, ledger, wait_s=0, clients=clients)
    assert result.fenced == ["eo.orders.0", "eo.orders.1"]
    assert outcomes == ["refused"]
    # Released afterwards.
    committer_tries(ledger, second.checkpoint_id, outcomes)
    assert outcomes == ["refused", "leased"]


def test_a_commit_started_while_the_abort_fences_is_refused_before_its_own_fence(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """An abort is fencing when a committer of the same checkpoint starts: the committer's
    lease (taken before its first fence) is refused by the abort's, so it fences nothing (an
    ``init_transactions`` of its own after the abort's fence would give it a producer the
    abort did not fence) and publishes nothing; the abort goes through."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    seen: list[str] = []

    def committer_starts(producer: FakeProducer) -> None:
        if seen:
            return
        seen.append("started")
        inits = broker.count("init_transactions")
        with pytest.raises(CommitLeaseHeld, match="is being committed by 'fence:"):
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
        seen.append(f"fenced {broker.count('init_transactions') - inits}")

    broker.on_call["init_transactions"] = committer_starts
    done = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
    assert done.state is CheckpointState.ABORTED
    assert seen == ["started", "fenced 0"]
    # The only transactions begun are the abort's marks, one per shard; nothing in the sink.
    assert broker.committed == [] and broker.count("begin_transaction") == 2
    assert all(broker.values(OUT, p) == [] for p in range(2))
