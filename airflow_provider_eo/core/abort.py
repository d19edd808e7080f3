"""Abort an unfinished checkpoint safely (``abort`` in Flink's two-phase commit).

An abort throws a checkpoint's staged output away and lets the next plan read its range
again. That is only safe when no shard published the checkpoint *and none can publish it
afterwards*: reading the commit markers alone is not enough, because a committer that has
produced its records and is paused before ``send_offsets_to_transaction`` commits after
the read, and the replanned range is then published twice. The steps, in this order:

1. Take the fence lease (core/fencing.py): the commit lease of EVERY unfinished checkpoint
   of the pipeline, a compare-and-set on the ledger's clock. Refused while a committer holds
   a live lease on any of them: on this checkpoint it may still publish it; on another one
   (the checkpoint before, committing) it uses the same transactional ids, one per commit
   shard, so step 2 would kill it. While the abort holds the lease, no committer passes its
   lease check and begins a transaction. An expired lease belongs to a dead or stalled
   committer: step 2 fences it.
2. Fence every shard's transactional id, renewing the lease before each one (and from a
   heartbeat while one takes long): a fresh producer per id and ``init_transactions`` bump
   the producer epoch, so the broker aborts whatever a paused committer left open and
   refuses its later ``send_offsets_to_transaction`` / ``commit_transaction`` (it fails
   fenced; none of its records become visible).
3. Only now read the markers: nothing can commit any more, so what they show is final.
   A shard that published the checkpoint makes the abort impossible (its output is in
   the sink; replanning would publish it twice): refused, data at risk.
3a. A PREPARED checkpoint gets its abort marks (core/abort_marks.py): per shard, a
   transaction of its id that reads the marker again and records the checkpoint as aborted,
   so a spark-mode commit task whose ``init_transactions`` comes after the fence (queued,
   retried) publishes nothing.
4. ``ledger.abort`` under the lease: PLANNED/PREPARED -> ABORTED, refused if a committer took
   the lease over since step 1 (this process stalled past it); the range is replanned from
   its start. The lease is released.

Idempotent: aborting an ABORTED checkpoint does nothing; a COMMITTED one is refused.
"""

from __future__ import annotations

from airflow_provider_eo import names
from airflow_provider_eo.core.abort_marks import mark_aborted
from airflow_provider_eo.core.fencing import FENCE_LEASE_S, FenceLease, fence, fence_owner
from airflow_provider_eo.core.markers import decide_marker
from airflow_provider_eo.core.shard import REAL_KAFKA, KafkaClients
from airflow_provider_eo.errors import AbortRefused
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger, ShardState
from airflow_provider_eo.ledger.leases import FORCE_LIVE_HINT, CommitInProgress
from airflow_provider_eo.pipeline import Pipeline


def shard_ids(pipeline: Pipeline, cp: CheckpointRecord, clients: KafkaClients = REAL_KAFKA) -> list[str]:
    """The transactional id of every commit shard of ``cp``: from its frozen commit plan, or
    (a checkpoint planned before plans were recorded) the plan today's settings make."""
    plan = cp.commit_plan
    if plan is None:
        sink_partitions = clients.partition_count(librdkafka_config(pipeline.kafka), pipeline.sink_topic)
        plan = names.commit_plan(pipeline, sink_partitions)
    return [names.plan_transactional_id(plan, pipeline.name, shard) for shard in range(plan.shards)]


def _pending_note(cp: CheckpointRecord) -> str:
    pending = [s.shard for s in cp.shards if s.state is ShardState.PENDING]
    return f"shards {pending} PENDING" if pending else "no shard recorded yet"


def _refusal(pipeline: Pipeline, ledger: Ledger, checkpoint_id: int, held: CommitInProgress) -> AbortRefused:
    """The abort's refusal while ``held`` names a committer's lease."""
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: "
    cp = ledger.get(pipeline.name, checkpoint_id)
    until = held.until.isoformat() if held.until else "?"
    committing = f"checkpoint {held.checkpoint_id} is being committed by {held.owner!r} until {until}"
    way_out = "" if held.lost else f" {FORCE_LIVE_HINT}"
    if held.checkpoint_id == checkpoint_id:
        return AbortRefused(
            f"{where}cannot be aborted while a live committer ({held.owner!r}, {_pending_note(cp)}) "
            f"holds its commit lease: {committing}; wait, or stop it first. It may still publish. "
            f"Nothing was aborted; the checkpoint stays {cp.state.value}. Once that lease ran "
            f"out, the abort fences the committer.{way_out}"
        )
    return AbortRefused(
        f"{where}cannot be aborted now: {committing}; wait, or stop it first. A pipeline's "
        "transactional ids are one per commit shard, shared by all its checkpoints, so fencing "
        "them for this abort would kill that committer. Nothing was aborted; checkpoint "
        f"{checkpoint_id} stays {cp.state.value}.{way_out}"
    )


def abort_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    reason: str,
    actor: Actor | None = None,
    force_live: bool = False,
    clients: KafkaClients = REAL_KAFKA,
    lease_ttl_s: float = FENCE_LEASE_S,
) -> CheckpointRecord:
    """Abort an unfinished checkpoint so its range is replanned, never while it can still
    be published, and never fencing the live committer of another checkpoint (see the module
    docstring for the steps).

    Idempotent: aborting an ABORTED checkpoint does nothing and returns it. Refuses
    (:class:`AbortRefused`) a COMMITTED checkpoint; any checkpoint while a live committer holds
    a commit lease on a checkpoint of the pipeline (retry once it finished or its lease ran
    out); and one a shard already published (data at risk).

    :param reason: recorded with the abort (the ledger's ``abort_reason`` and event).
    :param force_live: take the lease from a committer known to be dead while its lease runs;
        the fence of step 2 stops it should it come back.
    :param lease_ttl_s: how long each renewal of the abort's lease lasts (the heartbeat renews
        it every third of that).
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
    owner = fence_owner(actor)
    ids = shard_ids(pipeline, cp, clients)
    try:
        # 1. The fence lease: refused while any committer of the pipeline is live.
        with FenceLease(ledger, pipeline.name, owner=owner, ttl_s=lease_ttl_s, take_over=force_live) as lease:
            if checkpoint_id in lease.held:
                # 2. Fence every shard's transactional id, renewing the lease before each.
                fence(pipeline, ids, lease=lease, where=where, clients=clients)
                lease.renew()
                # 3. The markers, read after the fence: nothing can commit it any more.
                _refuse_if_published(pipeline, ledger, cp, len(ids), reason, clients)
                # 3a. The abort marks (core/abort_marks.py): a spark-mode commit task that
                # runs init_transactions after this fence reads them and publishes nothing
                # (only a PREPARED checkpoint has commit tasks).
                if cp.state is CheckpointState.PREPARED:
                    identity = ledger.get_pipeline(pipeline.name).identity
                    mark_aborted(pipeline, identity, cp, ids, renew=lease.renew, where=where, clients=clients)
                # 4. ABORTED, unless a committer took the lease over meanwhile.
                return ledger.abort(
                    pipeline.name, checkpoint_id, reason=reason, actor=actor, lease_owner=owner
                )
    except CommitInProgress as held:
        raise _refusal(pipeline, ledger, checkpoint_id, held) from held
    # Committed or aborted before the lease was taken: decide again.
    return abort_checkpoint(
        pipeline,
        ledger,
        checkpoint_id,
        reason=reason,
        actor=actor,
        force_live=force_live,
        clients=clients,
        lease_ttl_s=lease_ttl_s,
    )


def _refuse_if_published(
    pipeline: Pipeline, ledger: Ledger, cp: CheckpointRecord, shards: int, reason: str, clients: KafkaClients
) -> None:
    """Refuse (data at risk) when a shard's marker shows ``cp``; a marker of another ledger's
    pipeline identity is refused here too (never read as ours)."""
    identity = ledger.get_pipeline(pipeline.name).identity
    plan = cp.commit_plan
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    sink = plan.sink_topic if plan is not None else pipeline.sink_topic
    config = librdkafka_config(pipeline.kafka)
    published = []
    for shard in range(shards):
        found = clients.committed_marks(config, group, [(sink, shard)])
        mark = decide_marker(pipeline.name, group, sink, shard, found.get((sink, shard)), identity=identity)
        if mark >= cp.checkpoint_id:
            published.append(shard)
    if published:
        raise AbortRefused(
            f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}, but shards "
            f"{published} were already published, so the checkpoint cannot be aborted. Restore "
            "the staged files from a backup and retry the commit; data of the other shards is "
            "at risk."
        )


__all__ = ["abort_checkpoint", "shard_ids"]
