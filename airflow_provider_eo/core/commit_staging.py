"""A commit's staged output: verified against its manifest and the ledger before anything
is published (a verified mismatch aborts the checkpoint), removed once committed."""

from __future__ import annotations

import dataclasses

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.shard import KafkaClients
from airflow_provider_eo.errors import StagingError, StagingUnreadable
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CommitPlan, Ledger, PipelineRecord
from airflow_provider_eo.ledger.errors import CheckpointNotFound
from airflow_provider_eo.pipeline import Pipeline


def abort_if_unpublished(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    reason: str,
    actor: Actor | None,
    clients: KafkaClients | None = None,
) -> None:
    """Abort ``cp`` after a verified staging mismatch, safely (core/abort.py: refused while a
    live committer holds the lease, every shard id fenced before the markers are read), and
    raise :class:`StagingError` saying so. Refused (:class:`AbortRefused`, the checkpoint stays
    PREPARED) once a shard published it: recorded COMMITTED in the ledger, shown by its
    marker, or, its marker gone, by the sink's committed output."""
    clients = kafka_clients(pipeline.kafka, clients)
    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason=reason, actor=actor, clients=clients)
    raise StagingError(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}. Nothing was "
        "published; the checkpoint is ABORTED and its range will be replanned by the next run."
    )


def staged_partitions(cp: CheckpointRecord, store: staging_fs.StagingStore | None = None) -> int | None:
    """The partition count a checkpoint's output was staged for (None when unreadable: the
    verification below then decides)."""
    try:
        return staging.read_manifest(cp.staging_location or "", store).sink_partitions
    except (StagingError, StagingUnreadable, OSError):
        return None


def cleanup_staging(
    pipeline: Pipeline, ledger: Ledger, cp: CheckpointRecord, *, registered: PipelineRecord | None = None
) -> None:
    """Remove the staging of the committed checkpoint ``keep_committed_staging`` before
    ``cp``: this ledger's attempts of it (the recorded one, killed ones, any whose manifest
    names this identity), never an attempt a same-name deployment staged beside it.
    ``registered``: the pipeline's ledger record when the caller has it (not read again)."""
    old = cp.checkpoint_id - pipeline.keep_committed_staging
    if old < 1:
        return
    if old == cp.checkpoint_id:  # keep none: this checkpoint's own, recorded in ``cp``
        location = cp.staging_location
    else:
        try:
            location = ledger.get(pipeline.name, old).staging_location
        except CheckpointNotFound:
            return
    registered = registered or ledger.get_pipeline(pipeline.name)
    root = dataclasses.replace(pipeline, staging_dir=registered.staging_dir or pipeline.staging_dir)
    staging.remove_checkpoint_attempts(
        names.checkpoint_dir(root, old), registered.identity, location, staging_fs.store_for(pipeline)
    )


def verified_manifest(pipeline: Pipeline, cp: CheckpointRecord, plan: CommitPlan) -> staging.Manifest:
    """``cp``'s manifest, checked against the ledger's counts and the plan's partitions, and
    its staged files against the manifest: :class:`StagingError` on a mismatch,
    :class:`StagingUnreadable` (:class:`StagingNotVisible`) when it cannot be read."""
    checkpoint_id, sink_partitions = cp.checkpoint_id, plan.sink_partitions
    store = staging_fs.store_for(pipeline)
    manifest = staging.read_manifest(cp.staging_location or "", store)
    if (
        manifest.checkpoint_id != checkpoint_id
        or manifest.records != (cp.records or 0)
        or manifest.dead_letter_count != (cp.dead_letters or 0)
    ):
        raise StagingError(
            f"manifest at {cp.staging_location} is for checkpoint {manifest.checkpoint_id} "
            f"with {manifest.records} records and {manifest.dead_letter_count} dead letters, "
            f"the ledger expects {checkpoint_id} with {cp.records} and {cp.dead_letters or 0}"
        )
    if manifest.sink_partitions != sink_partitions:
        raise StagingError(
            f"the commit plan of sink topic {plan.sink_topic!r} has {sink_partitions} "
            f"partitions, the staged output was partitioned for {manifest.sink_partitions}"
        )
    staging.verify(cp.staging_location or "", manifest, store)
    return manifest
