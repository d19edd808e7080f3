"""A commit's checks before anything is published: the checkpoint's frozen commit plan, the
shards' commit markers, other deployments of the pipeline's name."""

from __future__ import annotations

from confluent_kafka import KafkaException

from airflow_provider_eo import staging_fs
from airflow_provider_eo.core.commit_plan import check_commit_plan, frozen_commit_plan
from airflow_provider_eo.core.commit_staging import staged_partitions
from airflow_provider_eo.core.markers import decide_marker
from airflow_provider_eo.core.shard import KafkaClients
from airflow_provider_eo.core.sink_guard import (
    check_commit_markers,
    mark_clear,
    other_deployments,
    other_deployments_error,
    recently_clear,
)
from airflow_provider_eo.errors import EoError
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CommitPlan, Ledger, PipelineRecord
from airflow_provider_eo.pipeline import Pipeline


def commit_plan_of(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    registered: PipelineRecord,
    *,
    actor: Actor | None,
    clients: KafkaClients,
) -> CommitPlan:
    """The commit plan ``cp`` is committed by (the sink's partitions read through ``clients``)."""
    # The frozen plan, never today's settings (a checkpoint from before ledger revision
    # 0002 freezes one now, for the partition count its output was staged for). Refuses a
    # process with another transactional-id prefix, and a sink that lost partitions.
    if cp.commit_plan is not None and registered.transactional_id_prefix == pipeline.transactional_id_prefix:
        # This process's prefix is the pinned one (a pin never changes): pinning it again
        # would change nothing, so only the plan is checked (no ledger write).
        plan = cp.commit_plan
        check_commit_plan(pipeline, cp, plan, clients=clients)
    else:
        plan = frozen_commit_plan(
            pipeline,
            ledger,
            cp,
            staged_partitions=staged_partitions(cp, staging_fs.store_for(pipeline))
            if cp.commit_plan is None
            else None,
            actor=actor,
            clients=clients,
        )
    return plan


def check_markers_before_publish(
    pipeline: Pipeline,
    registered: PipelineRecord,
    cp: CheckpointRecord,
    plan: CommitPlan,
    clients: KafkaClients,
) -> dict[int, int]:
    """The commit markers of ``cp``'s shards as committed now (shard -> the checkpoint each
    shows; a shard whose marker could not be read is left out), refused when one is past
    ``cp`` in a ledger that still has it PREPARED (:class:`LedgerBehindSink`)."""
    checkpoint_id, identity, shards = cp.checkpoint_id, registered.identity, plan.shards
    # First (before the staged output is read: an older ledger's staging may be gone): a
    # shard whose marker is already past this checkpoint: only a ledger older than the
    # sink gets here (checkpoints commit in order); skipping it as published would lose it.
    # Checked for every shard before anything is published, reading only the markers
    # committed now: a marker sent in a transaction still open (a killed or paused
    # committer's, which the shard's fence below aborts) is a pending offset commit on the
    # marker group's partition, and a stable read of it would wait until that transaction
    # ends (the broker's transaction timeout) or the read gives up. The sink's open
    # transactions do not tell where such a marker is (a shard's transaction need not
    # write to the partition named after it). A pending marker is read by commit_shard,
    # stable, after the shard's fence has decided it.
    readable = [(plan.sink_topic, s) for s in range(shards)]
    try:
        found = clients.committed_marks(plan.marker_group, readable, stable=False)
    except (EoError, KafkaException, TimeoutError):
        # Best effort (a broker down, a leader being elected): each shard checks its own
        # marker after its fence anyway.
        readable, found = [], {}
    markers = {
        s: decide_marker(
            pipeline.name,
            plan.marker_group,
            plan.sink_topic,
            s,
            found.get((plan.sink_topic, s)),
            identity=identity,
        )
        for _topic, s in readable
    }
    check_commit_markers(pipeline, registered, checkpoint_id, markers)
    return markers


def check_other_deployments_at_commit(
    pipeline: Pipeline, plan: CommitPlan, identity: str, clients: KafkaClients
) -> None:
    """Refuse (:class:`~airflow_provider_eo.errors.PipelineNameInUse`) when another
    deployment of this pipeline name publishes to another sink."""
    # Another deployment of this pipeline name (another ledger) that published to another
    # sink since this checkpoint was planned: refused before its committers and ours fence
    # each other (they share transactional ids). Best effort, as above: every plan checks it.
    bootstrap = str(pipeline.kafka.get("bootstrap.servers"))
    if not recently_clear("commit", bootstrap, plan.marker_group, identity):
        try:
            elsewhere = clients.marks_elsewhere(plan.marker_group, plan.sink_topic)
        except (EoError, KafkaException, TimeoutError):
            elsewhere = None
        others = other_deployments(elsewhere or {}, sink_topic=plan.sink_topic, identity=identity)
        if others:
            raise other_deployments_error(pipeline.name, plan.marker_group, plan.sink_topic, identity, others)
        if elsewhere is not None:
            mark_clear("commit", bootstrap, plan.marker_group, identity)
