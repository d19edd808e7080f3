"""The shards of a commit: each one's frozen committable, and the ledger's part of its
transaction in a local commit (the lease and the PENDING row before it begins, the
COMMITTED row after)."""

from __future__ import annotations

import time
from collections.abc import Callable

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.core.shard import ShardCommittable
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import with_dead_letter_limits
from airflow_provider_eo.ledger import CheckpointRecord, CommitPlan, Ledger
from airflow_provider_eo.pipeline import Pipeline


def shard_committable(
    pipeline: Pipeline,
    identity: str,
    cp: CheckpointRecord,
    manifest: staging.Manifest,
    plan: CommitPlan,
    shard: int,
    *,
    topic_max_bytes: int | None,
    dead_letter_max_bytes: int | None = None,
) -> ShardCommittable:
    """The frozen committable of one shard of ``cp``: the plan's transactional id, sink and
    marker group, the shard's staged files, and (the plan's last shard only) the pipeline
    group's offsets at the checkpoint's ends and the checkpoint's dead letters, with its
    producer sized for the dead-letter topic's ``dead_letter_max_bytes`` too."""
    last = shard == plan.shards - 1  # the plan's last shard also moves the pipeline's group
    kafka = librdkafka_config(pipeline.kafka)
    if last and manifest.dead_letters and dead_letter_max_bytes is not None:
        kafka = with_dead_letter_limits(kafka, dead_letter_max_bytes)
    return ShardCommittable(
        pipeline=pipeline.name,
        identity=identity,
        checkpoint_id=cp.checkpoint_id,
        shard=shard,
        transactional_id=names.plan_transactional_id(plan, pipeline.name, shard),
        sink_topic=plan.sink_topic,
        staging_location=cp.staging_location or "",
        parts=tuple((p, tuple(manifest.files[p])) for p in plan.partitions_of(shard) if p in manifest.files),
        marker_group=plan.marker_group,
        group_id=pipeline.group_id if last else None,
        group_offsets=tuple((r.topic, r.partition, r.end) for r in cp.ranges) if last else (),
        kafka=tuple(sorted(kafka.items())),
        transaction_timeout_ms=pipeline.transaction_timeout_ms,
        topic_max_bytes=topic_max_bytes,
        dead_letter_topic=manifest.dead_letter_topic if last else None,
        dead_letters=tuple(manifest.dead_letters) if last else (),
        staging_store=staging_fs.store_for(pipeline),
    )


class LedgerShardHooks:
    """The ledger's part of one shard's transaction in a local commit: the lease and the
    PENDING row before ``begin_transaction``, the COMMITTED row after, with the seconds the
    transaction that published took (from its own ``before_begin``: a failed round before it
    does not count; the plan sizes checkpoints from these, core/plan.py)."""

    #: The clock the publish time is measured with (unit tests move it by hand).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self, ledger: Ledger, committable: ShardCommittable, *, owner: str, row_before: bool | None = None
    ) -> None:
        """:param row_before: whether the ledger had a row for the shard when this commit
        read the checkpoint (None: not known, :meth:`may_have_published` reads it)."""
        self.ledger = ledger
        self.c = committable
        self.owner = owner
        self.row_before = row_before
        self._began: float | None = None  # the clock at this process's latest before_begin

    def _record(self, *, state: str, records: int, publish_s: float | None = None) -> None:
        self.ledger.record_shard(
            self.c.pipeline,
            self.c.checkpoint_id,
            self.c.shard,
            transactional_id=self.c.transactional_id,
            producer_id=None,
            producer_epoch=None,
            state=state,
            records=records,
            publish_s=publish_s,
        )

    def may_have_published(self) -> bool:
        """A shard row exists: a try got as far as ``begin_transaction``.

        With ``row_before`` (read with the checkpoint at the start of this commit) no read:
        a row written since by another committer that began a transaction is covered all
        the same, since its transaction is either aborted by this shard's fence or committed
        with the marker, which the caller read first (a spark-mode commit's tasks rely on
        the same early read)."""
        if self._began is not None:
            return True  # this process recorded the shard PENDING
        if self.row_before is not None:
            return self.row_before
        rows = self.ledger.get(self.c.pipeline, self.c.checkpoint_id).shards
        return any(row.shard == self.c.shard for row in rows)

    def before_begin(self) -> None:
        """Take the commit lease (the database's clock), then record the shard PENDING.

        Every committer uses the pinned prefix, so the fence before this already stopped any
        other; the lease only keeps live committers from taking turns."""
        self._began = self.clock()
        self.ledger.acquire_commit_lease(
            self.c.pipeline, self.c.checkpoint_id, owner=self.owner, ttl_s=2 * self.c.timeout_s + 30
        )
        self._record(state="PENDING", records=self.c.records)

    def committed(self, records: int) -> None:
        """Record the shard COMMITTED, with its publish time when this process published it
        (none when a marker showed an earlier process's transaction)."""
        seconds = None if self._began is None else max(0.0, self.clock() - self._began)
        self._record(state="COMMITTED", records=records, publish_s=seconds)
