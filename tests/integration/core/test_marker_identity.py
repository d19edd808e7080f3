"""A commit marker names the ledger (pipeline identity) that wrote it.

A re-created ledger, or a second deployment with the same pipeline name on the same
cluster, used to find markers >= its checkpoint ids and skip publishing: checkpoints were
reported COMMITTED while none of their records reached the sink. Now it is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eo_harness import Harness

from airflow_provider_eo import names
from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.errors import PipelineIdentityMismatch
from airflow_provider_eo.kafka.audit import settled_ends
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Startup

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _committed(ledger: Ledger, pipeline: str) -> list[int]:
    checkpoints = ledger.list_checkpoints(pipeline)
    return [c.checkpoint_id for c in checkpoints if c.state is CheckpointState.COMMITTED]


def test_recreated_ledger_is_refused_not_skipped(harness: Callable[..., Any], tmp_path: Path) -> None:
    """The measured scenario, scaled down: group startup, four checkpoints committed, the
    ledger file removed, new input: the new ledger must not report COMMITTED what never
    reached the sink (old code: three checkpoints COMMITTED, none of their records in it)."""
    h = harness(
        source_partitions=2,
        sink_partitions=2,
        commit_shards=2,
        startup=Startup(mode="group"),
        max_records_per_checkpoint=250,
    )
    h.produce(1000)
    assert len(h.drain()) == 4
    h.assert_exactly_once(expected_records=1000)
    old_identity = h.ledger.get_pipeline(h.pipeline.name).identity

    h.ledger.close()
    ledger_file = Path(h.pipeline.ledger_url.removeprefix("sqlite:///"))
    for path in ledger_file.parent.glob(ledger_file.name + "*"):  # the file and its WAL
        path.unlink()
    fresh = Harness(h.pipeline, h.config, h.spark)  # what a new ledger file looks like
    try:
        fresh.produce(1000, start=1000)
        sink_ends = settled_ends(h.config, [(h.pipeline.sink_topic, p) for p in (0, 1)])
        with pytest.raises(PipelineIdentityMismatch) as refused:
            fresh.drain()
        new_identity = fresh.ledger.get_pipeline(h.pipeline.name).identity
        message = str(refused.value)
        assert h.pipeline.name in message and names.marker_group(h.pipeline) in message
        assert old_identity in message and new_identity in message
        assert "kafka-consumer-groups" in message and "original ledger" in message
        # Nothing planned, nothing reported COMMITTED, nothing published.
        assert fresh.ledger.list_checkpoints(h.pipeline.name) == []
        assert _committed(fresh.ledger, h.pipeline.name) == []
        after = settled_ends(h.config, list(sink_ends))
        assert after == sink_ends
        # The old ledger's output is not this ledger's: foreign, never "unexpected".
        report = audit_pipeline(h.pipeline, fresh.ledger)
        assert report.ok and report.foreign == 1000, report.as_dict()
    finally:
        fresh.ledger.close()


def test_second_deployment_with_the_same_name_is_refused_at_commit(
    harness: Callable[..., Any], tmp_path: Path
) -> None:
    """Two ledgers, one pipeline name: both plan checkpoint 1 before either commits (so the
    plan-time check sees no marker); the second committer finds the first one's marker and
    must refuse instead of reporting COMMITTED with nothing published."""
    a = harness(source_partitions=1, sink_partitions=2, commit_shards=2)
    other = replace(
        a.pipeline,
        ledger_url=f"sqlite:///{tmp_path / 'other-ledger.db'}",
        staging_dir=str(tmp_path / "other-staging"),
    )
    b = Harness(other, a.config, a.spark)
    try:
        a.produce(200)
        cp_a, cp_b = a.plan(), b.plan()
        assert cp_a.checkpoint_id == cp_b.checkpoint_id == 1
        a.prepare(1)
        b.prepare(1)
        a.commit(1)
        ends = settled_ends(a.config, [(a.pipeline.sink_topic, p) for p in (0, 1)])
        with pytest.raises(PipelineIdentityMismatch):
            b.commit(1)
        assert b.ledger.get(b.pipeline.name, 1).state is CheckpointState.PREPARED  # not COMMITTED
        assert settled_ends(a.config, list(ends)) == ends
        a.assert_exactly_once(expected_records=200)
    finally:
        b.ledger.close()


def test_identity_check_does_not_wait_for_a_killed_committers_open_transaction(
    harness: Callable[..., Any],
) -> None:
    """A committer stopped with its transaction open (its marker pending): the plan-time
    identity check reads committed markers only and answers at once, instead of waiting
    until the broker aborts the transaction (the next DAG run's plan used to fail after 30 s)."""
    import signal
    import time

    from airflow_provider_eo.core.markers import check_marker_identity

    h = harness(source_partitions=1, sink_partitions=2, commit_shards=2)
    h.produce(40)
    h.run_once()  # checkpoint 1 committed: both shards have a marker
    h.produce(40, start=40)
    from eo_faultlib import paused_commit

    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    child = paused_commit(h, "commit.before_end_txn")  # checkpoint 2's shard 0 marker pending
    try:
        identity = h.ledger.get_pipeline(h.pipeline.name).identity
        started = time.monotonic()
        check_marker_identity(h.pipeline, identity)
        with pytest.raises(PipelineIdentityMismatch, match="shows checkpoint 1"):
            check_marker_identity(h.pipeline, "0000000000000000")  # committed markers still checked
        assert time.monotonic() - started < 10
    finally:
        child.send_signal(signal.SIGKILL)
        child.proc.wait(30)
