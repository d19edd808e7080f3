"""Commit a PREPARED checkpoint: publish its staged output in Kafka transactions.

Per commit shard, in shard order (``notifyCheckpointComplete`` -> ``commit`` in Flink):

1. A fresh producer with the shard's stable transactional id; ``init_transactions``
   fences any zombie and aborts whatever an earlier attempt left open.
2. Read the shard's commit marker. Already at this checkpoint: the shard is done (the
   crash came after the Kafka commit) and nothing is re-sent.
3. Check the ledger lease (a committer with a different transactional id is refused
   here, because Kafka cannot fence it), then begin, produce the shard's staged records,
   send the marker (and, with the last shard, the pipeline group's offsets) with
   ``send_offsets_to_transaction``, and commit.
4. A retriable failure repeats the call; an abortable one aborts and redoes the shard;
   an ambiguous ``commit_transaction`` is never followed by an abort: the producer is
   dropped, a new one re-inits and the marker decides.
5. A failed delivery report (the broker refused a record) makes the transaction
   abortable: it is aborted (nothing of it is visible) and the shard redone, unless the
   broker will refuse the record every time (too large for the sink topic): then the
   commit fails naming the record, its partition and what to change, without looping.

When every shard shows the checkpoint, the ledger moves PREPARED -> COMMITTED.
Committing a COMMITTED checkpoint does nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.fault_seam import fault_point, fault_triggered
from airflow_provider_eo.errors import CommitError, NotPrepared, StagingError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import (
    Abortable,
    DeliveryFailures,
    ProducerLost,
    connect,
    group_metadata,
    kafka_call,
    largest_record,
    new_producer,
    offsets,
    produce_staged,
)
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

MAX_SHARD_ROUNDS = 5


@dataclass(frozen=True)
class CommitResult:
    """What one commit call did."""

    checkpoint: CheckpointRecord
    published: int  # records produced by this call
    shards_skipped: int  # shards whose marker already showed the checkpoint
    seconds: float
    note: str = ""


def marker_position(pipeline: Pipeline, shard: int) -> int:
    """The last checkpoint id shard ``shard`` committed (-1 when none). Reads only stable
    (committed) transactional offsets."""
    config = librdkafka_config(pipeline.kafka)
    found = admin.committed_group_offsets(
        config, names.marker_group(pipeline), [(pipeline.sink_topic, shard)]
    )
    return found.get((pipeline.sink_topic, shard), -1)


def _publish_shard(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    manifest: staging.Manifest,
    shard: int,
    shards: int,
    owner: str,
) -> tuple[int, bool]:
    """Publish one shard exactly once. Returns (records produced, skipped by marker)."""
    config = librdkafka_config(pipeline.kafka)
    txn_id = names.transactional_id(pipeline, shard)
    where = f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}, shard {shard}: "
    timeout_s = pipeline.transaction_timeout_ms / 1000
    partitions = sorted(
        p for p in manifest.files if names.shard_of(pipeline, p, manifest.sink_partitions) == shard
    )
    expected = sum(f.records for p in partitions for f in manifest.files[p])

    def record(*, state: str, records: int) -> None:
        ledger.record_shard(
            pipeline.name,
            cp.checkpoint_id,
            shard,
            transactional_id=txn_id,
            producer_id=None,
            producer_epoch=None,
            state=state,
            records=records,
        )

    last_failure = ""
    for _round in range(MAX_SHARD_ROUNDS):
        failures = DeliveryFailures()
        producer = new_producer(config, txn_id, pipeline.transaction_timeout_ms, on_failure=failures)
        try:
            kafka_call("metadata", connect, producer, pipeline.sink_topic, timeout_s, where=where)
            kafka_call("init_transactions", producer.init_transactions, timeout_s, where=where)
            if marker_position(pipeline, shard) >= cp.checkpoint_id:
                record(state="COMMITTED", records=expected)
                return 0, True
            # Kafka fences only the same transactional id; the lease stops a committer
            # configured with another prefix before anything is produced.
            ledger.acquire_commit_lease(
                pipeline.name, cp.checkpoint_id, owner=owner, ttl_s=2 * timeout_s + 30
            )
            record(state="PENDING", records=expected)
            kafka_call("begin_transaction", producer.begin_transaction, where=where)
            produced = 0
            ckpt_header = f"{pipeline.name}:{cp.checkpoint_id}".encode()
            for partition in partitions:
                batches = staging.iter_batches(cp.staging_location or "", manifest.files[partition])
                produced += produce_staged(
                    producer, pipeline.sink_topic, partition, batches, ckpt_header, where=where
                )
                fault_point("commit.after_begin")
            # Everything acknowledged by the broker before the commit step (commit would
            # flush anyway; this makes the crash point below well-defined).
            producer.flush(timeout_s)
            if failures:  # a refused record: the transaction can only be aborted now
                raise Abortable(failures.describe())
            fault_point("commit.before_commit_txn")
            marker = {(pipeline.sink_topic, shard): cp.checkpoint_id}
            kafka_call(
                "send_offsets_to_transaction(marker)",
                producer.send_offsets_to_transaction,
                offsets(marker),
                group_metadata(config, names.marker_group(pipeline)),
                timeout_s,
                where=where,
            )
            if shard == shards - 1:  # the last shard also moves the pipeline's group
                ends = {(r.topic, r.partition): r.end for r in cp.ranges}
                kafka_call(
                    "send_offsets_to_transaction(group)",
                    producer.send_offsets_to_transaction,
                    offsets(ends),
                    group_metadata(config, pipeline.group_id),
                    timeout_s,
                    where=where,
                )
            fault_point("commit.before_end_txn")
            try:
                if fault_triggered("commit.ambiguous_before"):
                    raise ProducerLost("injected: commit_transaction timed out before it was sent")
                kafka_call(
                    "commit_transaction",
                    producer.commit_transaction,
                    timeout_s,
                    deadline_s=2 * timeout_s,
                    where=where,
                )
                if fault_triggered("commit.ambiguous_after"):
                    raise ProducerLost("injected: the answer to commit_transaction was lost")
            except ProducerLost:
                # Ambiguous: the commit may or may not have happened. Never abort here;
                # drop this producer, re-init with a new one and let the marker decide.
                continue
            fault_point("commit.after_commit_txn")
            record(state="COMMITTED", records=produced)
            return produced, False
        except Abortable as exc:
            try:
                producer.abort_transaction(timeout_s)
            except Exception:  # the next round's init_transactions aborts it anyway
                pass
            producer.poll(0)  # serve the delivery reports still queued (the cause, if any)
            last_failure = failures.describe() if failures else str(exc)
            if failures.permanent:
                for partition in sorted(failures.partitions & set(partitions)):
                    found = largest_record(
                        staging.iter_batches(cp.staging_location or "", manifest.files[partition])
                    )
                    if found is not None:
                        index, src, size = found
                        last_failure += (
                            f"; the largest record of sink partition {partition} is record "
                            f"{index} of its staged output (source {src}, {size} bytes of key+value)"
                        )
                raise CommitError(
                    f"{where}{last_failure}. The broker refuses this record every time, so "
                    "the shard's transaction was aborted (nothing of it is visible) and the "
                    "checkpoint stays PREPARED. A size refusal means the sink topic "
                    f"{pipeline.sink_topic!r} lowered max.message.bytes (or the broker its "
                    "message.max.bytes) after prepare checked it: raise it above the record's "
                    "size and retry the commit. An authorization refusal needs WRITE on the "
                    "sink topic."
                ) from exc
            continue
        except ProducerLost:
            continue
        finally:
            del producer
    raise CommitError(
        f"{where}could not publish after {MAX_SHARD_ROUNDS} rounds of retriable/abortable "
        f"errors (last: {last_failure or 'an ambiguous or retriable failure'}). Nothing from "
        "an unfinished round is visible (aborted or fenced); retry the commit task later — "
        "the marker prevents duplicates."
    )


def _abort_if_unpublished(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    shards: int,
    reason: str,
    actor: Actor | None,
) -> None:
    """Abort ``cp`` after a verified staging mismatch, safely (core/abort.py: refused while a
    live committer holds the lease, every shard id fenced before the markers are read), and
    raise :class:`StagingError` saying so. ``shards`` is kept for callers; the abort derives
    the shard ids from the checkpoint's commit plan."""
    from airflow_provider_eo.core.abort import abort_checkpoint

    del shards
    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason=reason, actor=actor)
    raise StagingError(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}. Nothing was "
        "published; the checkpoint is ABORTED and its range will be replanned by the next run."
    )


def cleanup_staging(pipeline: Pipeline, cp: CheckpointRecord) -> None:
    """Remove staging of committed checkpoints beyond ``keep_committed_staging``."""
    old = cp.checkpoint_id - pipeline.keep_committed_staging
    if old >= 1:
        staging.remove(names.checkpoint_dir(pipeline, old))


def commit_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    actor: Actor | None = None,
    owner: str | None = None,
) -> CommitResult:
    """Publish a PREPARED checkpoint exactly once and mark it COMMITTED.

    Idempotent: committing a COMMITTED checkpoint does nothing; a retry after any crash
    publishes only the shards whose marker does not show the checkpoint yet.
    """
    started = time.monotonic()
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state is CheckpointState.COMMITTED:
        return CommitResult(cp, 0, 0, 0.0, note="already COMMITTED")
    if cp.state is not CheckpointState.PREPARED:
        raise NotPrepared(
            f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}, not "
            "PREPARED; run (or retry) its prepare step first"
        )
    config = librdkafka_config(pipeline.kafka)
    sink_partitions = admin.partition_count(config, pipeline.sink_topic)
    shards = names.shard_count(pipeline, sink_partitions)
    try:
        manifest = staging.read_manifest(cp.staging_location or "")
        if manifest.checkpoint_id != checkpoint_id or manifest.records != (cp.records or 0):
            raise StagingError(
                f"manifest at {cp.staging_location} is for checkpoint {manifest.checkpoint_id} "
                f"with {manifest.records} records, the ledger expects {checkpoint_id} with "
                f"{cp.records}"
            )
        if manifest.sink_partitions != sink_partitions:
            raise StagingError(
                f"sink topic {pipeline.sink_topic!r} now has {sink_partitions} partitions, the "
                f"staged output was partitioned for {manifest.sink_partitions}"
            )
        staging.verify(cp.staging_location or "", manifest)
    # StagingUnreadable (an I/O error) is not caught: the storage did not answer, the staged
    # output may be intact, so the commit fails retryably and nothing is aborted. Only a
    # verified mismatch (count, checksum, another checkpoint's manifest) aborts.
    except StagingError as exc:
        _abort_if_unpublished(
            pipeline, ledger, cp, shards, f"staged output failed verification ({exc})", actor
        )
        raise  # unreachable: the helper always raises
    owner = owner or names.lease_owner(pipeline)
    published = skipped = 0
    for shard in range(shards):
        n, was_done = _publish_shard(pipeline, ledger, cp, manifest, shard, shards, owner)
        published += n
        skipped += int(was_done)
    fault_point("commit.before_ledger")
    cp = ledger.mark_committed(pipeline.name, checkpoint_id, actor=actor)
    cleanup_staging(pipeline, cp)
    return CommitResult(cp, published, skipped, time.monotonic() - started)
