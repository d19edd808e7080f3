"""A shard the ledger records COMMITTED is published for good: no abort forgets it and no
commit publishes it again, whether or not its commit marker still exists (markers are group
offsets and expire with ``offsets.retention.minutes``). A shard recorded PENDING whose marker
is gone may have committed before its committer died: the sink's committed output decides,
never the missing marker.

Real SQLite ledger, real staged Parquet, fake Kafka; the committer "dies" by an exception
raised at a named fault point (what ``EO_FAULT=…`` with ``kill`` does to a real process).
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, prepared_checkpoint

from airflow_provider_eo import names
from airflow_provider_eo.core import shard as shard_module
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.errors import AbortRefused
from airflow_provider_eo.ledger import CheckpointState, Ledger, ShardState, leases
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 2
SINK_PARTITIONS = 2
OUTPUT = {0: [b"a0", b"a1", b"a2"], 1: [b"b0", b"b1"]}  # shard 0: partition 0, shard 1: partition 1


class Crash(BaseException):
    """The committer process dies here (nothing of it runs any more)."""


def crash_at(monkeypatch: pytest.MonkeyPatch, step: str, hit: int = 1) -> None:
    """The committer dies the ``hit``-th time it reaches ``step``."""
    seen = {"n": 0}

    def point(name: str) -> None:
        if name == step:
            seen["n"] += 1
            if seen["n"] == hit:
                raise Crash(step)

    monkeypatch.setattr(shard_module, "fault_point", point)


def lease_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The database's clock moves ten minutes on: every commit lease taken so far ran out."""
    real_now = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real_now(s) + dt.timedelta(minutes=10))


def half_committed(
    pipeline: Pipeline,
    ledger: Ledger,
    broker: FakeBroker,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    hit: int,
) -> int:
    """A checkpoint whose committer died at ``step`` (the ``hit``-th time), then its markers
    expired (the marker group's offsets are gone). Returns its id."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    with monkeypatch.context() as m:
        crash_at(m, step, hit)
        with pytest.raises(Crash):
            commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    broker.marks.clear()  # offsets.retention.minutes passed: every marker expired
    return cp.checkpoint_id


def test_an_abort_is_refused_when_the_ledger_records_a_shard_committed(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 0 committed (row COMMITTED), the committer died inside shard 1's transaction,
    the markers expired: the abort used to read no marker, set ABORTED, and the replanned
    range published shard 0's records a second time."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=2)
    rows = {s.shard: s.state for s in ledger.get("orders", cid).shards}
    assert rows == {0: ShardState.COMMITTED, 1: ShardState.PENDING}
    calls = len(broker.calls)
    with pytest.raises(AbortRefused) as refused:
        abort_checkpoint(
            pipeline,
            ledger,
            cid,
            reason="transaction timed out",
            force_live=True,
            clients=FakeClients(broker),
        )
    message = str(refused.value)
    assert f"pipeline 'orders', checkpoint {cid}: transaction timed out" in message
    assert "shard 0 (recorded COMMITTED in the ledger)" in message
    assert "cannot be aborted" in message and f"eo commit MODULE:ATTR --checkpoint {cid}" in message
    assert "Nothing was aborted" in message
    assert ledger.get("orders", cid).state is CheckpointState.PREPARED
    assert len(broker.calls) == calls  # refused before fencing anything: the row is final
    # the way out the refusal names: finishing the commit publishes shard 1 only
    done = commit_checkpoint(pipeline, ledger, cid, clients=FakeClients(broker))
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert broker.values(OUT, 0) == OUTPUT[0] and broker.values(OUT, 1) == OUTPUT[1]


def test_a_pending_shard_without_marker_is_decided_by_reading_the_sink_back(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard 0's transaction committed, the committer died before the ledger's COMMITTED row,
    the markers expired: only the sink's committed output shows the shard published."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.after_commit_txn", hit=1)
    assert [(s.shard, s.state) for s in ledger.get("orders", cid).shards] == [(0, ShardState.PENDING)]
    with pytest.raises(AbortRefused) as refused:
        abort_checkpoint(pipeline, ledger, cid, reason="test", force_live=True, clients=FakeClients(broker))
    assert "shard 0 (its committed output in the sink names this checkpoint)" in str(refused.value)
    assert ledger.get("orders", cid).state is CheckpointState.PREPARED
    assert ("", "read_back") in broker.calls


def test_a_pending_shard_whose_output_is_not_in_the_sink_is_aborted(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Died inside shard 0's transaction: the abort's fence aborts it, the read-back finds
    nothing of the checkpoint, the abort goes through and the replanned range is published
    once."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=1)
    done = abort_checkpoint(
        pipeline, ledger, cid, reason="test", force_live=True, clients=FakeClients(broker)
    )
    assert done.state is CheckpointState.ABORTED
    assert broker.committed == []
    again = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    commit_checkpoint(pipeline, ledger, again.checkpoint_id, clients=FakeClients(broker))
    assert broker.values(OUT, 0) == OUTPUT[0] and broker.values(OUT, 1) == OUTPUT[1]


def test_a_sink_that_cannot_be_read_back_refuses_the_abort(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No marker, a PENDING row, and the read-back fails: nothing proves the shard
    unpublished, so nothing is aborted."""
    from airflow_provider_eo.errors import CommitError

    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=1)
    clients = FakeClients(broker)

    def unreadable(*args: object) -> int:
        raise CommitError("could not read back out[0]")

    monkeypatch.setattr(clients, "last_published_checkpoint", unreadable)
    with pytest.raises(AbortRefused, match=r"could not read back out\[0\].*Nothing was aborted"):
        abort_checkpoint(pipeline, ledger, cid, reason="test", force_live=True, clients=clients)
    assert ledger.get("orders", cid).state is CheckpointState.PREPARED


def test_the_ledger_refuses_to_abort_a_checkpoint_with_a_committed_shard(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's own abort (any caller, with or without the fence lease) checks the rows."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=2)
    lease_ran_out(monkeypatch)
    with pytest.raises(AbortRefused, match=r"shards \[0\] are recorded COMMITTED"):
        ledger.abort("orders", cid, reason="test")
    assert ledger.get("orders", cid).state is CheckpointState.PREPARED


def test_a_committed_shard_is_never_published_again(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Markers expired AND the sink's retention removed shard 0's records: the read-back
    finds nothing, but the ledger's COMMITTED row is final, so the retry publishes shard 1
    only."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=2)
    broker.committed = [r for r in broker.committed if r.partition != 0]  # retention
    done = commit_checkpoint(pipeline, ledger, cid, clients=FakeClients(broker))
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert broker.values(OUT, 0) == []  # not published again
    assert broker.values(OUT, 1) == OUTPUT[1]
    assert (done.published, done.shards_skipped) == (len(OUTPUT[1]), 1)
    assert broker.count("begin_transaction", "eo.orders.0") == 1  # the first, committed one


def test_lost_staging_after_a_committed_shard_is_refused_not_aborted(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged file removed (an object-store lifecycle rule) after shard 0 committed and the
    markers expired: the commit must not abort the checkpoint (its range would be published
    again); it is refused and stays PREPARED."""
    cid = half_committed(pipeline, ledger, broker, monkeypatch, "commit.before_commit_txn", hit=2)
    lease_ran_out(monkeypatch)  # the dead committer's
    location = Path(ledger.get("orders", cid).staging_location or "")
    shutil.rmtree(location / "data" / "sink_partition=1")
    with pytest.raises(AbortRefused, match=r"shard 0 \(recorded COMMITTED in the ledger\)"):
        commit_checkpoint(pipeline, ledger, cid, clients=FakeClients(broker))
    assert ledger.get("orders", cid).state is CheckpointState.PREPARED
    assert broker.values(OUT, 0) == OUTPUT[0] and broker.values(OUT, 1) == []


def test_markers_still_refuse_as_before(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its marker alive, a published shard is named with the marker as its evidence."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    identity = ledger.get_pipeline("orders").identity
    broker.marks[(names.marker_group(pipeline), OUT, 1)] = (cp.checkpoint_id, names.marker_metadata(identity))
    with pytest.raises(AbortRefused, match=r"shard 1 \(its commit marker shows checkpoint 1\)"):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="test", clients=FakeClients(broker))
