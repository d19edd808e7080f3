"""docs/design.md §3, one test per row: kill a real process at the named step, then retry.

After each: the audit sees every record exactly once and the ledger is consistent.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo import names
from airflow_provider_eo.errors import StagingError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import high_watermarks
from airflow_provider_eo.ledger import CheckpointState, CommitLeaseHeld
from airflow_provider_eo.ledger.pipelines import TransactionalIdPrefixMismatch

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _sink_lso_and_hw(h: Any) -> tuple[dict[Any, int], dict[Any, int]]:
    parts = admin.partitions_of(h.config, [h.pipeline.sink_topic])[h.pipeline.sink_topic]
    tps = [(h.pipeline.sink_topic, p) for p in parts]
    return admin.list_offsets(h.config, tps, spec="latest"), high_watermarks(h.config, tps)


@pytest.mark.parametrize("step", ["prepare.after_write", "prepare.before_ledger"])
def test_prepare_killed_then_retried(harness: Callable[..., Any], step: str) -> None:
    h = harness(source_partitions=3, sink_partitions=2)
    h.produce(120)
    planned = h.plan()
    proc = h.cli("prepare", fault=step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PLANNED
    (result,) = h.drain()
    assert result.checkpoint.checkpoint_id == planned.checkpoint_id
    assert result.checkpoint.ranges == planned.ranges
    h.assert_exactly_once(expected_records=120)
    # the dead attempt's folder went with the committed checkpoint's staging
    assert not Path(names.checkpoint_dir(h.pipeline, planned.checkpoint_id)).exists()


def test_two_prepare_attempts_race_one_wins(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(80)
    planned = h.plan()
    a = h.cli("prepare", wait=False)
    b = h.cli("prepare", wait=False)
    outs = [p.communicate(timeout=300) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, [o[1][-1500:] for o in outs]
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED
    attempts = [d.name for d in Path(names.checkpoint_dir(h.pipeline, cp.checkpoint_id)).iterdir()]
    assert attempts == [f"attempt-{cp.prepared_attempt}"]  # the loser removed its folder
    h.commit(cp.checkpoint_id)
    h.assert_exactly_once(expected_records=80)


@pytest.mark.parametrize(
    "step",
    ["commit.after_begin", "commit.before_commit_txn", "commit.after_commit_txn", "commit.before_ledger"],
)
def test_commit_killed_then_retried(harness: Callable[..., Any], step: str) -> None:
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3)
    h.produce(150)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    proc = h.cli("commit", fault=step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.PREPARED
    result = h.commit(planned.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    if step in ("commit.before_ledger",):
        assert result.published == 0 and result.shards_skipped == 3
    h.assert_exactly_once(expected_records=150)


def test_zombie_committer_is_fenced(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(50)
    planned, zombie = h.paused_commit()
    try:
        # While its lease runs, the paused committer is a live one: refused, nothing fenced.
        with pytest.raises(CommitLeaseHeld, match="is being committed by 'commit:"):
            h.commit(planned.checkpoint_id)
        h.expire_lease(planned.checkpoint_id)  # paused, it cannot renew: its lease runs out
        result = h.commit(planned.checkpoint_id)  # init_transactions fences the zombie
        assert result.published == 50
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    _out, err = zombie.communicate(timeout=120)
    assert zombie.returncode != 0
    assert "fenced" in err.decode().lower() or "epoch" in err.decode().lower(), err[-2000:]
    h.assert_exactly_once(expected_records=50)


def test_committer_paused_past_transaction_timeout(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1, transaction_timeout_ms=5000)
    h.produce(40)
    planned, paused = h.paused_commit()
    try:
        # While its transaction is open the sink's last stable offset lags the high
        # watermark; the broker's timeout abort lets it catch up.
        # the paused transaction's records are on the broker but not yet stable
        lso, hw = _sink_lso_and_hw(h)
        assert sum(hw.values()) == 40 and sum(lso.values()) == 0
        wait_for(lambda: (lambda lh: lh[0] == lh[1])(_sink_lso_and_hw(h)), "the broker to abort")
        h.expire_lease(planned.checkpoint_id)  # paused, it cannot renew its lease
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    paused.communicate(timeout=120)
    assert paused.returncode != 0
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.PREPARED
    h.commit(planned.checkpoint_id)
    h.assert_exactly_once(expected_records=40)


def test_committer_with_another_transactional_id_is_refused(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=2)
    h.produce(30)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    # a live committer (this process) holds the lease (its transactional ids: eo.<pipeline>.N)
    h.ledger.acquire_commit_lease(
        h.pipeline.name, planned.checkpoint_id, owner=names.lease_owner(), ttl_s=300
    )
    other = h.with_(transactional_id_prefix="other")
    lso_before, _ = _sink_lso_and_hw(h)
    # refused by the prefix pinned at plan time, before the lease is even looked at
    with pytest.raises(TransactionalIdPrefixMismatch):
        other.commit(planned.checkpoint_id)
    assert _sink_lso_and_hw(h)[1] == lso_before  # nothing produced, not even uncommitted
    h.commit(planned.checkpoint_id)  # the lease holder finishes
    h.assert_exactly_once(expected_records=30)


def test_truncated_staging_is_refused_aborted_and_replanned(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(100)
    planned = h.plan()
    prepared = h.prepare(planned.checkpoint_id).checkpoint
    victim = next(Path(prepared.staging_location).rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(StagingError, match="ABORTED"):
        h.commit(planned.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.ABORTED
    (result,) = h.drain()
    assert result.checkpoint.checkpoint_id == planned.checkpoint_id + 1
    assert result.checkpoint.ranges == planned.ranges
    h.assert_exactly_once(expected_records=100)


@pytest.mark.parametrize("step", ["commit.ambiguous_before", "commit.ambiguous_after"])
def test_ambiguous_commit_is_decided_by_the_marker(
    harness: Callable[..., Any], step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``commit_transaction`` with an unknown outcome: never abort, re-init, read the marker."""
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(90)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    monkeypatch.setenv("EO_FAULT", step)
    monkeypatch.setenv("EO_FAULT_ACTION", "raise")
    result = h.commit(planned.checkpoint_id)
    assert "EO_FAULT" not in os.environ  # the injected failure really happened
    assert result.checkpoint.state is CheckpointState.COMMITTED
    if step == "commit.ambiguous_after":  # it had committed: the marker says so, nothing re-sent
        assert result.published == 0 and result.shards_skipped == 1
    else:  # it had not: re-init aborted the open transaction and the shard was redone
        assert result.published == 90
    h.assert_exactly_once(expected_records=90)
