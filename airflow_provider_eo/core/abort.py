"""Abort an unfinished checkpoint safely (``abort`` in Flink's two-phase commit).

An abort throws a checkpoint's staged output away and lets the next plan read its range
again. That is only safe when no shard published the checkpoint *and none can publish it
afterwards*: reading the commit markers alone is not enough, because a committer that has
produced its records and is paused before ``send_offsets_to_transaction`` commits after
the read, and the replanned range is then published twice. The steps, in this order:

1. Refuse while a live committer holds the checkpoint's commit lease (its shard rows are
   PENDING): the abort takes the lease itself, a compare-and-set on the ledger's clock, so
   while it holds it no committer passes its lease check and begins a transaction. An
   expired lease belongs to a dead or stalled committer: step 2 fences it.
2. Fence every shard's transactional id: a fresh producer per id and
   ``init_transactions`` bump the producer epoch, so the broker aborts whatever a paused
   committer left open and refuses its later ``send_offsets_to_transaction`` /
   ``commit_transaction`` (it fails fenced; none of its records become visible).
3. Only now read the markers: nothing can commit any more, so what they show is final.
   A shard that published the checkpoint makes the abort impossible (its output is in
   the sink; replanning would publish it twice): refused, data at risk.
4. ``ledger.abort``: PLANNED/PREPARED -> ABORTED; the range is replanned from its start.

Idempotent: aborting an ABORTED checkpoint does nothing; a COMMITTED one is refused.
"""

from __future__ import annotations

from airflow_provider_eo import names
from airflow_provider_eo.core.markers import decide_marker
from airflow_provider_eo.core.shard import REAL_KAFKA, KafkaClients, fence_id
from airflow_provider_eo.errors import AbortRefused, EoError
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import ProducerLost
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointConflict,
    CheckpointRecord,
    CheckpointState,
    CommitLeaseHeld,
    InvariantViolation,
    Ledger,
    ShardState,
)
from airflow_provider_eo.pipeline import Pipeline

#: How long the abort holds the commit lease: the fence and the marker reads take seconds.
ABORT_LEASE_S = 120.0


def abort_owner(actor: Actor | None) -> str:
    """The commit-lease owner an abort uses: never a committer's owner, so a live committer's
    lease is seen as held by someone else."""
    return f"abort:{(actor or Actor.here()).label() or 'unknown'}"


def shard_ids(pipeline: Pipeline, cp: CheckpointRecord, clients: KafkaClients = REAL_KAFKA) -> list[str]:
    """The transactional id of every commit shard of ``cp``: from its frozen commit plan, or
    (a checkpoint planned before plans were recorded) the plan today's settings make."""
    plan = cp.commit_plan
    if plan is None:
        sink_partitions = clients.partition_count(librdkafka_config(pipeline.kafka), pipeline.sink_topic)
        plan = names.commit_plan(pipeline, sink_partitions)
    return [names.plan_transactional_id(plan, pipeline.name, shard) for shard in range(plan.shards)]


def fence(
    pipeline: Pipeline,
    transactional_ids: list[str],
    *,
    where: str,
    refused: type[EoError] = AbortRefused,
    then: str = "Retry the abort once the broker answers.",
    clients: KafkaClients = REAL_KAFKA,
) -> None:
    """``init_transactions`` with a fresh producer per id: bumps each id's epoch, so the
    broker aborts any open transaction of an earlier producer and fences it.

    :param refused: the error raised when an id cannot be fenced (``then`` ends its message).
    """
    config = librdkafka_config(pipeline.kafka)
    for txn_id in transactional_ids:
        try:
            fence_id(
                txn_id,
                config=config,
                sink_topic=pipeline.sink_topic,
                transaction_timeout_ms=pipeline.transaction_timeout_ms,
                where=where,
                clients=clients,
            )
        except ProducerLost as exc:
            raise refused(
                f"{where}could not fence transactional id {txn_id!r} ({exc}); nothing was "
                f"aborted and the checkpoint is unchanged. {then}"
            ) from exc


def _pending_note(cp: CheckpointRecord) -> str:
    pending = [s.shard for s in cp.shards if s.state is ShardState.PENDING]
    return f"shards {pending} PENDING" if pending else "no shard recorded yet"


def abort_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    reason: str,
    actor: Actor | None = None,
    force_live: bool = False,
    clients: KafkaClients = REAL_KAFKA,
) -> CheckpointRecord:
    """Abort an unfinished checkpoint so its range is replanned, never while it can still
    be published (see the module docstring for the steps).

    Idempotent: aborting an ABORTED checkpoint does nothing and returns it. Refuses
    (:class:`AbortRefused`) a COMMITTED checkpoint, a checkpoint a live committer is
    publishing (retry once it finished or its lease expired), and one a shard already
    published (data at risk).

    :param reason: recorded with the abort (the ledger's ``abort_reason`` and event).
    :param force_live: skip step 1 for a committer known to be dead while its lease runs;
        the fence of step 2 still stops it should it come back.
    """
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: "
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state is CheckpointState.ABORTED:
        return cp
    if cp.state is CheckpointState.COMMITTED:
        raise AbortRefused(
            f"{where}is COMMITTED: its output is published and cannot be aborted. To process "
            "its range again, restore the pipeline from a savepoint (a recorded lineage break)."
        )
    # 1. A live committer holds the lease: refuse. Taking the lease ourselves keeps any
    #    committer from beginning a transaction until the checkpoint is ABORTED.
    if cp.state is CheckpointState.PREPARED and not force_live:
        try:
            ledger.acquire_commit_lease(
                pipeline.name, checkpoint_id, owner=abort_owner(actor), ttl_s=ABORT_LEASE_S
            )
        except CommitLeaseHeld as exc:
            raise AbortRefused(
                f"{where}cannot be aborted while a live committer ({cp.commit_owner!r}, "
                f"{_pending_note(cp)}) holds its commit lease until {cp.commit_lease_until}: "
                "it may still publish. Nothing was aborted; the checkpoint stays PREPARED. "
                "Let that commit finish, or retry the abort once its lease expired (the abort "
                "then fences it)."
            ) from exc
        except CheckpointConflict:  # committed or aborted meanwhile: decide again
            return abort_checkpoint(
                pipeline,
                ledger,
                checkpoint_id,
                reason=reason,
                actor=actor,
                force_live=force_live,
                clients=clients,
            )
        except InvariantViolation:
            pass  # an earlier checkpoint is unfinished: no committer can commit this one yet
    # 2. Fence every shard's transactional id.
    ids = shard_ids(pipeline, cp, clients)
    fence(pipeline, ids, where=where, clients=clients)
    # 3. The markers, read after the fence: nothing can commit this checkpoint any more.
    #    A marker of another ledger's pipeline identity is refused here too (never read as ours).
    identity = ledger.get_pipeline(pipeline.name).identity
    plan = cp.commit_plan
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    sink = plan.sink_topic if plan is not None else pipeline.sink_topic
    config = librdkafka_config(pipeline.kafka)
    published = []
    for shard in range(len(ids)):
        found = clients.committed_marks(config, group, [(sink, shard)])
        mark = decide_marker(pipeline.name, group, sink, shard, found.get((sink, shard)), identity=identity)
        if mark >= checkpoint_id:
            published.append(shard)
    if published:
        raise AbortRefused(
            f"{where}{reason}, but shards {published} were already published, so the "
            "checkpoint cannot be aborted. Restore the staged files from a backup and retry "
            "the commit; data of the other shards is at risk."
        )
    # 4. ABORTED: the next plan reads the range again from its start.
    return ledger.abort(pipeline.name, checkpoint_id, reason=reason, actor=actor)


__all__ = ["ABORT_LEASE_S", "abort_checkpoint", "abort_owner", "fence", "shard_ids"]
