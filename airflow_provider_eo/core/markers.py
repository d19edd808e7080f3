"""Commit markers: the proof, kept by Kafka, that a shard's transaction committed.

A commit marker is a transactional offset commit in a consumer group the provider owns
(never shared with real consumers), sent in the same Kafka transaction as the shard's data,
so it becomes visible exactly when the data does (docs/design.md §2). Its offset is the
checkpoint id; its metadata names the ledger identity of the pipeline that wrote it.

Everything that reads markers (plan, commit, abort, backfill, doctor) goes through
:func:`decide_marker`, so a marker written by another ledger is refused the same way
everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_eo import names
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.errors import PipelineIdentityMismatch
from airflow_provider_eo.ledger import CommitPlan
from airflow_provider_eo.pipeline import Pipeline

#: What a shard without a marker shows.
NO_MARKER = -1


def decide_marker(
    pipeline_name: str,
    group: str,
    sink: str,
    shard: int,
    found: tuple[int, str] | None,
    *,
    identity: str | None,
) -> int:
    """The checkpoint id a shard's marker shows (:data:`NO_MARKER` when there is none).

    ``found`` is the committed (offset, metadata) of the marker group on ``sink[shard]``.
    A marker naming another pipeline identity is refused with
    :class:`PipelineIdentityMismatch`: trusting it would skip publishing checkpoints this
    ledger never published. A marker without an identity (written before markers carried
    one) is taken as this pipeline's. ``identity=None`` skips the check (diagnostics only).
    """
    checkpoint_id, metadata = found if found is not None else (NO_MARKER, "")
    owner = names.marker_identity(metadata)
    if identity is not None and owner is not None and owner != identity:
        raise PipelineIdentityMismatch(
            f"pipeline {pipeline_name!r}: the commit marker of shard {shard} (consumer group "
            f"{group!r}, {sink}[{shard}]) shows checkpoint {checkpoint_id} "
            f"published by pipeline identity {owner}, but this ledger's pipeline has identity "
            f"{identity}: another ledger (a re-created or moved ledger file, a `downgrade "
            "base`, or a second deployment with the same pipeline name on this Kafka "
            "cluster) published it. Nothing was planned or published by this call. Point the pipeline "
            "at its original ledger (ledger_url); to start over on purpose, use a new "
            "pipeline name, or delete the marker group with `kafka-consumer-groups "
            f"--bootstrap-server ... --delete --group {group}` (then its checkpoints "
            "are no longer protected against republishing)."
        )
    return checkpoint_id


def read_markers(
    pipeline: Pipeline,
    shards: Iterable[int],
    *,
    identity: str | None,
    plan: CommitPlan | None = None,
    clients: KafkaClients | None = None,
) -> dict[int, int]:
    """The last checkpoint id each shard's commit marker shows (-1: no marker), in one read
    of stable (committed) transactional offsets; with ``plan``, in the plan's marker group
    and sink topic (else the pipeline's current ones). Foreign markers are refused
    (:func:`decide_marker`)."""
    clients = kafka_clients(pipeline.kafka, clients)
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    sink = plan.sink_topic if plan is not None else pipeline.sink_topic
    wanted = sorted(set(shards))
    found = clients.committed_marks(group, [(sink, s) for s in wanted])
    return {
        shard: decide_marker(pipeline.name, group, sink, shard, found.get((sink, shard)), identity=identity)
        for shard in wanted
    }


def marker_position(
    pipeline: Pipeline, shard: int, plan: CommitPlan | None = None, *, identity: str | None = None
) -> int:
    """The last checkpoint id shard ``shard`` committed (-1 when none), refusing a marker of
    another pipeline identity (see :func:`read_markers`). Reads only stable (committed)
    transactional offsets."""
    return read_markers(pipeline, [shard], identity=identity, plan=plan)[shard]


def check_marker_identity(pipeline: Pipeline, identity: str, *, clients: KafkaClients | None = None) -> None:
    """Raise :class:`PipelineIdentityMismatch` when any commit marker of the pipeline was
    written by another ledger. One read (the markers of every sink partition: shard ``s``'s
    marker lives on partition ``s``); used at plan time so nothing is planned against
    foreign markers."""
    clients = kafka_clients(pipeline.kafka, clients)
    group, sink = names.marker_group(pipeline), pipeline.sink_topic
    shards = range(clients.partition_count(sink))
    # Committed markers only, not waiting for open transactions: a killed committer's
    # pending marker would stall this read until the broker aborts its transaction; a
    # pending marker is checked by the commit's own (stable) read once it is decided.
    found = clients.committed_marks(group, [(sink, s) for s in shards], stable=False)
    for shard in shards:
        decide_marker(pipeline.name, group, sink, shard, found.get((sink, shard)), identity=identity)


__all__ = [
    "NO_MARKER",
    "check_marker_identity",
    "decide_marker",
    "marker_position",
    "read_markers",
]
