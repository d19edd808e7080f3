"""Every name the protocol derives: transactional ids, marker groups, staging paths, and the
names the Airflow operator and the Spark driver must spell alike.

One module so that a rename can never make two parts disagree.
"""

from __future__ import annotations

import os
import re
import socket

from airflow_provider_eo import processes
from airflow_provider_eo.ledger.records import Actor, CommitPlan
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.provenance import HEADER_PROVENANCE as HEADER_PROVENANCE
from airflow_provider_eo.provenance import PROVENANCE_COMPACT as PROVENANCE_COMPACT
from airflow_provider_eo.provenance import PROVENANCE_IDENTITY_CHARS as PROVENANCE_IDENTITY_CHARS
from airflow_provider_eo.provenance import compact_provenance as compact_provenance
from airflow_provider_eo.provenance import compact_provenance_prefix as compact_provenance_prefix
from airflow_provider_eo.provenance import parse_checkpoint_field as parse_checkpoint_field
from airflow_provider_eo.provenance import parse_provenance as parse_provenance
from airflow_provider_eo.provenance import provenance_checkpoint_field as provenance_checkpoint_field
from airflow_provider_eo.provenance import varint as varint

CONNECTIONS_FILE_ENV = "EO_CONNECTIONS_FILE"
"""Environment variable naming the private file through which an Airflow task hands the
settings it read from connections to the Spark driver it starts in client deploy mode (the
path only: the settings themselves never travel in the environment; see
:mod:`airflow_provider_eo.connections`)."""

PREPARE_APP = "eo-prepare"
"""The Spark application name of a prepare job (``spark-submit --name``)."""


def prepare_app_name(pipeline_name: str, checkpoint_id: int | None = None) -> str:
    """The Spark application name of the prepare job of one pipeline (and checkpoint)."""
    base = f"{PREPARE_APP}-{pipeline_name}"
    return base if checkpoint_id is None else f"{base}-{checkpoint_id}"


COMMIT_APP = "eo-commit"
"""The Spark application name of a spark-mode commit job (``spark-submit --name``)."""


def commit_app_name(pipeline_name: str, checkpoint_id: int | None = None) -> str:
    """The Spark application name of the commit job of one pipeline (and checkpoint)."""
    base = f"{COMMIT_APP}-{pipeline_name}"
    return base if checkpoint_id is None else f"{base}-{checkpoint_id}"


LEASE_OWNER_PREFIX = "commit:"
"""How every committer's commit-lease owner begins (a fence's begins with ``fence:``)."""

_OWNER_MAX = 250  # the ledger's commit_owner column


def lease_owner(actor: Actor | None = None) -> str:
    """The commit-lease owner of a committer in THIS process:
    ``commit:[dag/run/task#try]@host:pid~tag`` (the Airflow ids when ``actor`` has them).

    One committer per process and Airflow try: two processes (two tries of a task, a stream
    and an ``eo commit``, a restarted stream) never share a lease, so a second committer is
    refused while the first's lease is live; one process's successive commits (a stream's
    checkpoints) share it. ``tag`` (:func:`~airflow_provider_eo.processes.process_tag`) tells
    this process apart from any later process with the same pid, so a committer on the same
    machine can tell that the holder is gone (:func:`lease_owner_process`)."""
    a = actor or Actor()
    who = Actor(dag_id=a.dag_id, run_id=a.run_id, task_id=a.task_id, try_number=a.try_number).label()
    where = f"@{socket.gethostname()}:{os.getpid()}~{processes.process_tag()}"
    room = _OWNER_MAX - len(LEASE_OWNER_PREFIX) - len(where)
    return f"{LEASE_OWNER_PREFIX}{who[: max(room, 0)]}{where}"[-_OWNER_MAX:]


_OWNER_PROCESS = re.compile(r"@(?P<host>[^@~:]*):(?P<pid>\d+)~(?P<tag>[^@~]*)$")


def lease_owner_process(owner: str) -> tuple[str, int, str] | None:
    """``(host, pid, tag)`` of a committer's lease owner made by :func:`lease_owner`; None for
    any other owner (a fence's, a committer of an older release)."""
    found = _OWNER_PROCESS.search(owner) if owner.startswith(LEASE_OWNER_PREFIX) else None
    return (found["host"], int(found["pid"]), found["tag"]) if found else None


def plan_transactional_id(plan: CommitPlan, pipeline_name: str, shard: int) -> str:
    """The stable ``transactional.id`` of commit shard ``shard`` under a checkpoint's frozen
    commit plan: ``{prefix}.{pipeline}.{shard}`` (the one spelling of it).

    Stable per shard so ``init_transactions`` fences the previous attempt's producer; the
    broker keeps state per distinct id, so ids are never made unique per attempt.
    """
    return f"{plan.transactional_id_prefix}.{pipeline_name}.{shard}"


def marker_group(pipeline: Pipeline) -> str:
    """The provider-owned consumer group holding the commit markers (never a real consumer).

    Named from the pipeline name only, on purpose: a re-created ledger or a second
    deployment with the same name must *find* the markers another ledger wrote, so that
    their identity (:func:`marker_metadata`) can refuse it instead of skipping work.
    """
    return f"eo-marker.{pipeline.name}"


MARKER_METADATA_PREFIX = "eo1:"


def marker_metadata(identity: str) -> str:
    """The committed-offset metadata of a commit marker: ``eo1:<pipeline identity>``.

    The identity is made by the ledger when it first registers the pipeline
    (``PipelineRecord.identity``); the metadata travels with the offset through
    ``TxnOffsetCommit`` and comes back from ``committed()``.
    """
    return f"{MARKER_METADATA_PREFIX}{identity}"


def marker_identity(metadata: str | None) -> str | None:
    """The pipeline identity a marker's metadata names; ``None`` for a marker written before
    markers carried one (empty metadata) or by something else."""
    if metadata and metadata.startswith(MARKER_METADATA_PREFIX):
        return metadata[len(MARKER_METADATA_PREFIX) :] or None
    return None


def aborted_group(pipeline_name: str) -> str:
    """The provider-owned consumer group holding the abort marks (never a real consumer):
    per commit shard, the checkpoints an abort fenced and gave up, so a Spark commit task
    that begins after the abort refuses them (core/abort_marks.py). Apart from the marker
    group, so a commit marker always means "published"."""
    return f"eo-aborted.{pipeline_name}"


ABORT_MARK_PREFIX = "eoab1:"


def abort_mark_metadata(identity: str, aborted: str) -> str:
    """The committed-offset metadata of an abort mark: ``eoab1:<identity>:<checkpoint ids>``
    (ids as ranges, e.g. ``4,7-9``)."""
    return f"{ABORT_MARK_PREFIX}{identity}:{aborted}"


def parse_abort_mark(metadata: str | None) -> tuple[str, str] | None:
    """(identity, checkpoint ids) of an abort mark's metadata; None for anything else."""
    if not metadata or not metadata.startswith(ABORT_MARK_PREFIX):
        return None
    identity, sep, ids = metadata[len(ABORT_MARK_PREFIX) :].rpartition(":")
    return (identity, ids) if sep and identity else None


def checkpoint_dir(pipeline: Pipeline, checkpoint_id: int) -> str:
    """The staging folder of one checkpoint (holds one sub-folder per prepare attempt)."""
    return os.path.join(pipeline.staging_dir, pipeline.name, f"cp-{checkpoint_id:010d}")


def attempt_dir(pipeline: Pipeline, checkpoint_id: int, attempt: str) -> str:
    """The attempt-scoped staging folder a prepare writes into."""
    return os.path.join(checkpoint_dir(pipeline, checkpoint_id), f"attempt-{attempt}")


MANIFEST = "_eo_manifest.json"
"""Written last into an attempt folder: its presence means the staged output is complete."""

DEAD_LETTERS_DIR = "dead"
"""The folder of an attempt holding its dead letters (Parquet), beside ``data``."""

# Headers of a record on the dead-letter topic, beside the source record's own headers: why
# it is there, where it came from, and which checkpoint of which pipeline (and ledger
# identity, as in ``eo.prov``) sent it. The audit counts a source record found here, under
# this pipeline's identity, as a dead letter.
HEADER_DLQ_ERROR = "eo.error"
HEADER_DLQ_TOPIC = "eo.source.topic"
HEADER_DLQ_PARTITION = "eo.source.partition"
HEADER_DLQ_OFFSET = "eo.source.offset"
HEADER_DLQ_PIPELINE = "eo.pipeline"
HEADER_DLQ_CHECKPOINT = "eo.checkpoint"
HEADER_DLQ_IDENTITY = "eo.identity"


def shard_count(pipeline: Pipeline, sink_partitions: int) -> int:
    """Commit shards actually used: at most one per sink partition (a shard's marker lives
    on the sink partition with its number)."""
    return max(1, min(pipeline.commit_shards, sink_partitions))


def shard_of(pipeline: Pipeline, sink_partition: int, sink_partitions: int) -> int:
    """The commit shard that publishes ``sink_partition``."""
    return sink_partition % shard_count(pipeline, sink_partitions)


def commit_plan(pipeline: Pipeline, sink_partitions: int, prefix: str | None = None) -> CommitPlan:
    """The commit plan a checkpoint planned now is frozen with (docs/design.md §2).

    Today's rules: ``min(commit_shards, sink_partitions)`` shards, sink partition ``p`` goes
    to shard ``p % shards``, the pipeline's marker group, and ``prefix`` (the pinned
    transactional-id prefix; the configured one when not given).
    """
    if sink_partitions < 1:
        raise ValueError(f"pipeline {pipeline.name!r}: a sink topic has at least one partition")
    return CommitPlan(
        sink_topic=pipeline.sink_topic,
        sink_partitions=sink_partitions,
        transactional_id_prefix=prefix if prefix is not None else pipeline.transactional_id_prefix,
        marker_group=marker_group(pipeline),
        shard_of_partition=tuple(shard_of(pipeline, p, sink_partitions) for p in range(sink_partitions)),
    )
