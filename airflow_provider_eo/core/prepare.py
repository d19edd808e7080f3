"""Prepare one checkpoint (docs/design.md §2): stage exactly its planned ranges, write the
manifest last, move the ledger PLANNED -> PREPARED naming that attempt.

This module owns the protocol step; the engine that reads the ranges, runs the user's
transform and writes the staged files is a :class:`Stager` passed in (the Spark one is
``airflow_provider_eo.spark.stager.SparkStager``). Core never imports the engine: the
composition points (the CLI, the spark-submit apps, the operators) build the stager and
hand it to :func:`prepare_checkpoint`, :func:`~airflow_provider_eo.core.runner.run_once`
or :func:`~airflow_provider_eo.core.stream.run_stream`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.core.commit_plan import frozen_commit_plan
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.core.plan import data_loss_error, lost_ranges
from airflow_provider_eo.errors import DeadLetterTooLarge, PrepareError, StagingError
from airflow_provider_eo.kafka.admin import KAFKA_MAX_MESSAGE_BYTES
from airflow_provider_eo.kafka.publisher import dead_letter_headers, record_batch_size
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointConflict,
    CheckpointRecord,
    CheckpointState,
    Ledger,
    RangeSpec,
)
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.staging import StagedFile

__all__ = [
    "PrepareResult",
    "RangeRead",
    "StageRequest",
    "StageResult",
    "Stager",
    "check_dead_letters_fit",
    "check_staged_visible",
    "new_attempt",
    "prepare_checkpoint",
]


@dataclass(frozen=True)
class StageRequest:
    """What a stager needs to stage one checkpoint's output.

    :param pipeline: the pipeline (its Kafka settings, transform and Spark settings).
    :param checkpoint_id: the checkpoint being prepared.
    :param attempt: this attempt's name (part of :attr:`path`).
    :param ranges: every planned range, empty ones too (a stager reads only the others).
    :param time_filter: a backfill checkpoint's ``(start_ms, end_ms)``: only records whose
        Kafka timestamp lies in ``[start_ms, end_ms)``; ``None`` reads everything.
    :param sink_partitions: the frozen commit plan's partition count (never the sink's live one).
    :param max_message_bytes: the sink topic's ``max.message.bytes``: a larger record is refused.
    :param path: the fresh attempt folder; the staged files go under ``{path}/data``.
    :param where: names the pipeline and checkpoint in error messages.
    """

    pipeline: Pipeline
    checkpoint_id: int
    attempt: str
    ranges: tuple[RangeSpec, ...]
    time_filter: tuple[int, int] | None
    sink_partitions: int
    max_message_bytes: int
    path: str
    where: str

    @property
    def store(self) -> staging_fs.StagingStore:
        """How :attr:`path` is opened in this process (:func:`~airflow_provider_eo.staging_fs.store_for`)."""
        return staging_fs.store_for(self.pipeline)


@dataclass(frozen=True)
class RangeRead:
    """What the stager read of one non-empty planned range: the records counted (never
    ``end - start``: a transactional input has offset gaps) and their min/max Kafka
    timestamp in epoch ms (``None`` when nothing was read)."""

    range: RangeSpec
    records: int
    min_timestamp_ms: int | None
    max_timestamp_ms: int | None

    def manifest_entry(self) -> dict[str, Any]:
        """The range as the manifest lists it."""
        r = self.range
        return {
            "topic": r.topic,
            "partition": r.partition,
            "start": r.start,
            "end": r.end,
            "read": self.records,
        }


@dataclass(frozen=True)
class StageResult:
    """What a stager staged and observed.

    :param files: per sink partition, the Parquet files written, in publish order
        (:func:`airflow_provider_eo.staging.describe_attempt` of the attempt folder).
    :param reads: per non-empty planned range, what was read (in plan order).
    :param app_id: the engine's application id (the ledger's ``spark_app_id``).
    :param rows_written: output records the engine counted while writing, per sink
        partition (partitions it wrote nothing to may be left out); ``None`` when the engine
        does not count them (then nothing can be checked against the files).
    :param sources_kept: distinct source positions among the output records: the records
        read minus this is what the transform dropped (``None``: not counted).
    :param created: output records without a source position (made by the transform).
    :param dead_letters: the dead-letter files written (source records the transform
        failed on, or whose output the sink would refuse), as this process lists them.
    :param dead_letters_written: the dead letters the engine wrote (checked against the
        listed files like ``rows_written``).
    """

    files: dict[int, list[StagedFile]]
    reads: tuple[RangeRead, ...]
    app_id: str | None
    rows_written: dict[int, int] | None = None
    sources_kept: int | None = None
    created: int = 0
    dead_letters: tuple[StagedFile, ...] = ()
    dead_letters_written: int = 0

    @property
    def records_read(self) -> int:
        """Source records read, over every range."""
        return sum(r.records for r in self.reads)

    def manifest_ranges(self) -> list[dict[str, Any]]:
        """The manifest's ``ranges``."""
        return [r.manifest_entry() for r in self.reads]

    def range_stats(self) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """The ledger's (min, max) record timestamp per range read."""
        return {r.range.key: (r.min_timestamp_ms, r.max_timestamp_ms) for r in self.reads}

    @property
    def dropped(self) -> int | None:
        """Source records the transform dropped (read, but no output record names them).

        ``None`` when not counted, and when the output has records of which none carries a
        source position (an aggregation's): whether a source record was dropped or went into
        an output record cannot be told then, and it is never counted as dropped."""
        if self.sources_kept is None or (self.sources_kept == 0 and self.created > 0):
            return None
        return max(0, self.records_read - self.sources_kept - self.dead_letter_count)

    @property
    def dead_letter_count(self) -> int:
        """Source records staged for the dead-letter topic."""
        return sum(f.records for f in self.dead_letters)


def check_staged_visible(request: StageRequest, staged: StageResult) -> None:
    """Refuse a stage whose files, as this process lists them, do not hold the records the
    engine counted while writing them (per sink partition): the executors wrote to a
    staging folder this process does not see (a local ``staging_dir`` with a cluster
    master), so publishing the listing would commit fewer records than were read.

    :raises StagingError: naming the pipeline, checkpoint, ``staging_dir`` and the counts.
    """
    if staged.dead_letters_written != staged.dead_letter_count:
        raise StagingError(
            f"{request.where}: the Spark job wrote {staged.dead_letters_written} dead letters but "
            f"this process sees {staged.dead_letter_count} under {request.path}. staging_dir "
            f"{request.pipeline.staging_dir!r} must be one location shared by the Spark driver, "
            "every executor and the committer. Nothing was published; the checkpoint stays PLANNED."
        )
    if staged.rows_written is None:
        return
    written = {p: n for p, n in staged.rows_written.items() if n}
    listed = {p: sum(f.records for f in files) for p, files in staged.files.items()}
    listed = {p: n for p, n in listed.items() if n}
    if written == listed:
        return
    differ = sorted(p for p in set(written) | set(listed) if written.get(p, 0) != listed.get(p, 0))
    detail = ", ".join(
        f"sink partition {p}: {written.get(p, 0)} written, {listed.get(p, 0)} listed" for p in differ[:5]
    )
    more = f" (and {len(differ) - 5} more partitions)" if len(differ) > 5 else ""
    raise StagingError(
        f"{request.where}: the Spark job wrote {sum(written.values())} records but this process "
        f"sees {sum(listed.values())} in the staged files under {request.path} ({detail}{more}). "
        f"staging_dir {request.pipeline.staging_dir!r} must be one location shared by the Spark "
        "driver, every executor and the committer (a shared filesystem mounted at the same "
        "path everywhere, or hdfs://, s3a://, gs://, abfss://); a local folder works only with a "
        "local master. Nothing was published; the checkpoint stays PLANNED."
    )


def check_dead_letters_fit(request: StageRequest, staged: StageResult, *, identity: str, limit: int) -> None:
    """Refuse a stage with a dead letter the dead-letter topic cannot take: each is sent as
    the whole source record with its ``eo.dlq.*`` headers, and one over the topic's
    ``max.message.bytes`` (``limit``) would fail the commit on every retry.

    :raises DeadLetterTooLarge: naming the record's source position, its size, both topics'
        limits and what to do.
    """
    if not staged.dead_letters:
        return
    pipeline = request.pipeline
    for batch in staging.iter_batches(request.path, list(staged.dead_letters), store=request.store):
        for row in batch.to_pylist():
            headers = dead_letter_headers(
                row, pipeline=pipeline.name, checkpoint_id=request.checkpoint_id, identity=identity
            )
            size = record_batch_size(row["key"], row["value"], headers)
            if size <= limit:
                continue
            topic = pipeline.dead_letter_topic
            error = str(row["error"])
            error = error if len(error) <= 300 else f"{error[:300]}..."
            raise DeadLetterTooLarge(
                f"{request.where}: source record {row['src_topic']}[{row['src_partition']}] offset "
                f"{row['src_offset']} makes a dead letter of {size} bytes (the whole source record "
                f"with its eo.dlq.* headers), but the dead-letter topic {topic!r} takes at most "
                f"max.message.bytes={limit} (the sink topic {pipeline.sink_topic!r}: "
                f"max.message.bytes={request.max_message_bytes}); it became a dead letter because "
                f"{error}. Nothing was published; the checkpoint stays PLANNED. Raise the "
                f"max.message.bytes of {topic!r} to at least {size} (kafka-configs --alter "
                f"--entity-type topics --entity-name {topic} --add-config max.message.bytes=...), "
                "or fix the transform so the record is published or dropped, then retry the prepare."
            )


class Stager(Protocol):
    """The engine behind a prepare: reads the planned ranges, runs the transform, writes the
    staged files. It never touches the ledger or writes the manifest.

    On a failure it removes the attempt folder it wrote into and raises the typed error
    (:class:`~airflow_provider_eo.errors.PrepareError` and its branches) that names what
    to fix.
    """

    def start(self, pipeline: Pipeline) -> None:
        """Make the engine ready for ``pipeline``'s prepares (idempotent). Callers that care
        when the engine starts call it themselves; :func:`prepare_checkpoint` calls it first."""
        ...

    def stage(self, request: StageRequest) -> StageResult:
        """Stage ``request``'s checkpoint under ``request.path``."""
        ...


@dataclass(frozen=True)
class PrepareResult:
    """What one prepare call did."""

    checkpoint: CheckpointRecord
    attempt: str | None  # None when nothing had to be done
    records: int
    records_read: int
    seconds: float
    note: str = ""


def new_attempt() -> str:
    """A fresh attempt name: sortable by start time, unique across racing attempts."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def shard_counts_of(
    partition_counts: Mapping[int, int], shard_of_partition: tuple[int, ...]
) -> dict[int, int]:
    """Output records per commit shard, from the records per sink partition."""
    counts: dict[int, int] = {}
    for partition, count in partition_counts.items():
        shard = shard_of_partition[partition]
        counts[shard] = counts.get(shard, 0) + count
    return counts


def prepare_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    stager: Stager,
    attempt: str | None = None,
    actor: Actor | None = None,
    clients: KafkaClients | None = None,
) -> PrepareResult:
    """Stage the output of one PLANNED checkpoint with ``stager`` and move it to PREPARED
    (the brokers asked through ``clients``).

    Idempotent: preparing a PREPARED or COMMITTED checkpoint does nothing; two attempts
    racing both stage, exactly one wins the PLANNED -> PREPARED update, the other deletes
    its own folder. Each step is safe to repeat after a crash: a new attempt writes a new
    folder, and a folder without a manifest is never published.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    require_applied(pipeline, where="the prepare")
    stager.start(pipeline)
    started = time.monotonic()
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}"
    # 1. The planned range, from the ledger. PREPARED/COMMITTED: nothing to do; ABORTED: refuse.
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
        return PrepareResult(cp, None, cp.records or 0, 0, 0.0, note=f"already {cp.state.value}")
    if cp.state is not CheckpointState.PLANNED:
        raise PrepareError(
            f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}; only "
            "PLANNED checkpoints can be prepared (an aborted range is replanned by the next plan)"
        )
    # The output is partitioned for the checkpoint's frozen commit plan, never the sink's
    # live partition count (a checkpoint from before ledger revision 0002 freezes it now).
    commit_plan = frozen_commit_plan(pipeline, ledger, cp, actor=actor, clients=clients)
    # A deleted source (or a missing dead-letter topic) is a clear error naming it. The topics
    # this checkpoint reads are looked up by lost_ranges below (with the same error); the
    # others, and the dead-letter topic, in one metadata request here.
    read = {r.topic for r in cp.ranges if r.end > r.start}
    topics = [t for t in pipeline.source_topics if t not in read]
    if pipeline.dead_letter_topic is not None and pipeline.dead_letters_enabled:
        topics.append(pipeline.dead_letter_topic)
    if topics:
        clients.partitions_of(topics)
    # Offsets retention (or a topic re-creation) took away fail every retry the same way:
    # name the lost ranges and what to do instead of the engine's offset-out-of-range error.
    lost = lost_ranges(pipeline, list(cp.ranges), clients=clients)
    if lost:
        raise data_loss_error(pipeline, cp, lost)
    # The broker's limit, or the pipeline's setting when describing the topic is refused.
    max_bytes = clients.topic_max_message_bytes(pipeline.sink_topic, pipeline.sink_max_message_bytes)
    attempt = attempt or new_attempt()
    # The staging location is resolved once and pinned in the ledger: a relative staging_dir
    # in a process started elsewhere stages (and the commit reads) where the first one did.
    location, relative = staging.resolve_location(pipeline.staging_dir)
    store = staging_fs.store_for(pipeline)
    staging.check_reachable(pipeline.name, location, store)
    pinned = ledger.pin_staging_dir(pipeline.name, location, relative=relative)
    path = names.attempt_dir(dataclasses.replace(pipeline, staging_dir=pinned), checkpoint_id, attempt)

    # 2. The engine reads exactly the planned ranges, transforms, and writes the staged files
    #    under the fresh attempt folder (it removes the folder itself when it fails).
    request = StageRequest(
        pipeline=pipeline,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        ranges=tuple(cp.ranges),
        time_filter=cp.time_filter,
        sink_partitions=commit_plan.sink_partitions,
        max_message_bytes=max_bytes,
        path=path,
        where=where,
    )
    staged = stager.stage(request)
    identity = ledger.get_pipeline(pipeline.name).identity
    try:
        check_staged_visible(request, staged)
        if staged.dead_letters and pipeline.dead_letter_topic is not None:
            # The dead-letter topic's own limit (the sink's says nothing about it); the
            # broker's default when describing the topic is refused.
            limit = clients.topic_max_message_bytes(pipeline.dead_letter_topic, KAFKA_MAX_MESSAGE_BYTES)
            check_dead_letters_fit(request, staged, identity=identity, limit=limit)
    except (StagingError, DeadLetterTooLarge):
        staging.remove(path, store)
        raise
    fault_point("prepare.after_write")

    # 3. The manifest, last: its presence means the staged output is complete.
    manifest = staging.Manifest(
        pipeline=pipeline.name,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        sink_topic=commit_plan.sink_topic,
        sink_partitions=commit_plan.sink_partitions,
        files=staged.files,
        records_read=staged.records_read,
        ranges=staged.manifest_ranges(),
        dropped=staged.dropped,
        created=staged.created,
        identity=identity,
        dead_letters=list(staged.dead_letters),
        dead_letter_topic=pipeline.dead_letter_topic if staged.dead_letters else None,
    )
    staging.write_manifest(path, manifest, store)
    fault_point("prepare.before_ledger")

    # 4. PLANNED -> PREPARED naming this attempt; a losing attempt's folder is garbage.
    try:
        cp = ledger.mark_prepared(
            pipeline.name,
            checkpoint_id,
            attempt=attempt,
            staging_location=path,
            records=manifest.records,
            bytes_=manifest.bytes,
            shard_counts=shard_counts_of(manifest.partition_counts(), commit_plan.shard_of_partition),
            range_stats=staged.range_stats(),
            spark_app_id=staged.app_id,
            actor=actor,
            records_read=staged.records_read,
            records_dropped=staged.dropped,
            records_created=staged.created,
            dead_letters=staged.dead_letter_count,
        )
    except CheckpointConflict:
        staging.remove(path, store)
        cp = ledger.get(pipeline.name, checkpoint_id)
        return PrepareResult(
            cp,
            None,
            cp.records or 0,
            staged.records_read,
            time.monotonic() - started,
            note=f"another attempt ({cp.prepared_attempt}) prepared it first",
        )
    return PrepareResult(cp, attempt, manifest.records, staged.records_read, time.monotonic() - started)
