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
3. Only now decide whether a shard published the checkpoint: nothing can commit any more,
   so what the evidence shows is final. A shard published it when its commit marker shows
   it, when the ledger records the shard COMMITTED (final: markers expire with the broker's
   ``offsets.retention.minutes``, the row does not), or, for a shard recorded PENDING (a try
   may have begun its transaction) whose marker is gone, when the sink's committed output
   read back names the checkpoint; a read-back that fails proves nothing and refuses too.
   A published shard makes the abort impossible (its output is in the sink; replanning
   would publish it twice): refused, and the commit is finished instead. A shard recorded
   COMMITTED is refused before anything is fenced (step 0).
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
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.markers import NO_MARKER, decide_marker
from airflow_provider_eo.core.shard import KafkaClients
from airflow_provider_eo.errors import AbortRefused, CommitError
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointRecord,
    CheckpointState,
    CommitPlan,
    Ledger,
    ShardState,
)
from airflow_provider_eo.ledger.leases import FORCE_LIVE_HINT, CommitInProgress
from airflow_provider_eo.pipeline import Pipeline


def _plan_of(pipeline: Pipeline, cp: CheckpointRecord, clients: KafkaClients) -> CommitPlan:
    """``cp``'s frozen commit plan, or (a checkpoint planned before plans were recorded) the
    plan today's settings make."""
    if cp.commit_plan is not None:
        return cp.commit_plan
    sink_partitions = clients.partition_count(pipeline.sink_topic)
    return names.commit_plan(pipeline, sink_partitions)


def shard_ids(pipeline: Pipeline, cp: CheckpointRecord, clients: KafkaClients | None = None) -> list[str]:
    """The transactional id of every commit shard of ``cp``: from its frozen commit plan, or
    (a checkpoint planned before plans were recorded) the plan today's settings make."""
    clients = kafka_clients(pipeline.kafka, clients)
    plan = _plan_of(pipeline, cp, clients)
    return [names.plan_transactional_id(plan, pipeline.name, shard) for shard in range(plan.shards)]


def committed_rows(cp: CheckpointRecord) -> list[int]:
    """The shards of ``cp`` the ledger records COMMITTED: published for good (a row is written
    COMMITTED only after the shard's transaction committed or its marker showed it)."""
    return sorted(s.shard for s in cp.shards if s.state is ShardState.COMMITTED)


def published_refusal(
    pipeline: Pipeline, cp: CheckpointRecord, reason: str, evidence: dict[int, str]
) -> AbortRefused:
    """The refusal of an abort of ``cp`` some of whose shards are published (``evidence``:
    shard -> what shows it), with the way forward."""
    shards = "; ".join(f"shard {shard} ({why})" for shard, why in sorted(evidence.items()))
    return AbortRefused(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}, but it cannot be "
        f"aborted: part of it is already in the sink: {shards}. Aborting would replan its range "
        "and publish those records a second time. Nothing was aborted; the checkpoint stays "
        f"{cp.state.value}. Finish the commit instead: `eo commit MODULE:ATTR --checkpoint "
        f"{cp.checkpoint_id}` (or `eo recover MODULE:ATTR`, which also fences what a dead "
        "committer left open) publishes only the shards not yet published; a shard recorded "
        "COMMITTED is never published again. If its staged output is gone, restore the staged "
        "files from a backup first."
    )


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
    clients: KafkaClients | None = None,
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
    clients = kafka_clients(pipeline.kafka, clients)
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: "
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state is CheckpointState.ABORTED:
        return cp
    if cp.state is CheckpointState.COMMITTED:
        raise AbortRefused(
            f"{where}is COMMITTED: its output is published and cannot be aborted. To process "
            "its range again, restore the pipeline from a savepoint (a recorded lineage break)."
        )
    # 0. A shard the ledger records COMMITTED is published for good: nothing to fence or read.
    published = committed_rows(cp)
    if published:
        raise published_refusal(
            pipeline, cp, reason, {shard: "recorded COMMITTED in the ledger" for shard in published}
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
    """Refuse (:class:`AbortRefused`) when a shard published ``cp``: its marker shows it, the
    ledger records it COMMITTED, or (recorded PENDING, its marker gone) the sink's committed
    output names it. A marker of another ledger's pipeline identity is refused here too
    (never read as ours). Called after every shard id was fenced: what it finds is final."""
    identity = ledger.get_pipeline(pipeline.name).identity
    plan = _plan_of(pipeline, cp, clients)
    rows = {s.shard: s.state for s in ledger.get(pipeline.name, cp.checkpoint_id).shards}
    evidence: dict[int, str] = {}
    for shard in range(shards):
        found = clients.committed_marks(plan.marker_group, [(plan.sink_topic, shard)])
        mark = decide_marker(
            pipeline.name,
            plan.marker_group,
            plan.sink_topic,
            shard,
            found.get((plan.sink_topic, shard)),
            identity=identity,
        )
        if mark >= cp.checkpoint_id:
            evidence[shard] = f"its commit marker shows checkpoint {mark}"
        elif rows.get(shard) is ShardState.COMMITTED:
            evidence[shard] = "recorded COMMITTED in the ledger"
        elif (
            # A try began the shard's transaction and the marker that would show whether it
            # committed is gone (expired): the committed output decides, never the absence.
            mark == NO_MARKER
            and shard in rows
            and _read_back(pipeline, cp, plan, shard, identity, reason, clients) >= cp.checkpoint_id
        ):
            evidence[shard] = "its committed output in the sink names this checkpoint"
    if evidence:
        raise published_refusal(pipeline, cp, reason, evidence)


def _read_back(
    pipeline: Pipeline,
    cp: CheckpointRecord,
    plan: CommitPlan,
    shard: int,
    identity: str,
    reason: str,
    clients: KafkaClients,
) -> int:
    """The highest checkpoint of this pipeline in the committed output of ``shard``'s sink
    partitions (a shard's transaction is atomic over them); a read that fails refuses the
    abort, since nothing then shows the shard unpublished."""
    last = NO_MARKER
    for partition in plan.partitions_of(shard):
        try:
            found = clients.last_published_checkpoint(plan.sink_topic, partition, pipeline.name, identity)
        except CommitError as exc:
            raise AbortRefused(
                f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}, but shard "
                f"{shard} began a transaction (recorded PENDING) and its commit marker is gone, so "
                f"only the sink can show whether it published; it could not be read ({exc}). "
                f"Nothing was aborted; the checkpoint stays {cp.state.value}. Retry the abort when "
                "the sink is readable, or finish the commit instead (`eo commit MODULE:ATTR "
                f"--checkpoint {cp.checkpoint_id}`)."
            ) from exc
        last = max(last, found)
        if last >= cp.checkpoint_id:
            break
    return last


__all__ = ["abort_checkpoint", "committed_rows", "published_refusal", "shard_ids"]
