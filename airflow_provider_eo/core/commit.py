"""Commit a PREPARED checkpoint: publish its staged output in Kafka transactions.

Every try uses the checkpoint's commit plan, frozen when it was planned (sink topic, its
partition count, the shard -> partition map, the transactional-id prefix, the marker group),
never the current settings; a process configured with another transactional-id prefix than
the one pinned for the pipeline is refused before anything is produced.

Per commit shard of the plan, in shard order (``notifyCheckpointComplete`` -> ``commit``):

1. A fresh producer with the shard's stable transactional id; ``init_transactions``
   fences any zombie and aborts whatever an earlier attempt left open.
2. Read the shard's commit marker. Already at this checkpoint: the shard is done (the
   crash came after the Kafka commit) and nothing is re-sent. A marker written by another
   ledger's pipeline identity is refused; a missing one (expired, topic re-created) is
   replaced by reading back the shard's committed output when a try may have published.
3. Take the ledger lease (on the database's clock; it keeps healthy committers from
   fencing each other, the pinned prefix is what lets Kafka fence every other committer),
   then begin, produce the shard's staged records,
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
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.fault_seam import fault_point, fault_triggered
from airflow_provider_eo.core.plan import frozen_commit_plan
from airflow_provider_eo.errors import CommitError, NotPrepared, PipelineIdentityMismatch, StagingError
from airflow_provider_eo.kafka import admin, audit
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
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, CommitPlan, Ledger
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


def read_markers(
    pipeline: Pipeline, shards: Iterable[int], *, identity: str | None, plan: CommitPlan | None = None
) -> dict[int, int]:
    """The last checkpoint id each shard's commit marker shows (-1: no marker), in one read
    of stable (committed) transactional offsets; with ``plan``, in the plan's marker group
    and sink topic (else the pipeline's current ones).

    A marker carries the identity of the ledger that wrote it (``eo1:<identity>`` metadata).
    One naming another identity is refused with :class:`PipelineIdentityMismatch`: trusting
    it would skip publishing checkpoints this ledger never published. A marker without one
    (written before markers carried it) is taken as this pipeline's. ``identity=None``
    skips the check (diagnostics only).
    """
    config = librdkafka_config(pipeline.kafka)
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    sink = plan.sink_topic if plan is not None else pipeline.sink_topic
    wanted = sorted(set(shards))
    found = admin.committed_group_marks(config, group, [(sink, s) for s in wanted])
    out: dict[int, int] = {}
    for shard in wanted:
        checkpoint_id, metadata = found.get((sink, shard), (-1, ""))
        owner = names.marker_identity(metadata)
        if identity is not None and owner is not None and owner != identity:
            raise PipelineIdentityMismatch(
                f"pipeline {pipeline.name!r}: the commit marker of shard {shard} (consumer group "
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
        out[shard] = checkpoint_id
    return out


def marker_position(
    pipeline: Pipeline, shard: int, plan: CommitPlan | None = None, *, identity: str | None = None
) -> int:
    """The last checkpoint id shard ``shard`` committed (-1 when none), refusing a marker of
    another pipeline identity (see :func:`read_markers`). Reads only stable (committed)
    transactional offsets."""
    return read_markers(pipeline, [shard], identity=identity, plan=plan)[shard]


def check_marker_identity(pipeline: Pipeline, identity: str) -> None:
    """Raise :class:`PipelineIdentityMismatch` when any commit marker of the pipeline was
    written by another ledger. One read (the markers of every sink partition: shard ``s``'s
    marker lives on partition ``s``); used at plan time so nothing is planned against
    foreign markers."""
    config = librdkafka_config(pipeline.kafka)
    read_markers(pipeline, range(admin.partition_count(config, pipeline.sink_topic)), identity=identity)


def _published_by_output(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    manifest: staging.Manifest,
    shard: int,
    plan: CommitPlan,
    identity: str,
) -> int:
    """When a shard's marker is missing: the last checkpoint of this pipeline identity the
    shard's committed output shows (-1: none), the proof that does not expire.

    Markers are group offsets: they expire (``offsets.retention.minutes``) and vanish with
    the sink topic. Cases:

    1. No shard row for this checkpoint in the ledger: no transaction of this checkpoint was
       ever begun for the shard (the PENDING row is written before ``begin_transaction``,
       and the ledger does not expire), so it cannot be published: -1, publish.
    2. A row exists (a try got as far as ``begin_transaction``): read back the tail of one
       of the shard's sink partitions that this checkpoint has records for; every record
       carries ``<pipeline>:<checkpoint>:<identity8>`` and a shard's transaction is atomic
       over its partitions, so one partition answers for the shard.
    3. The checkpoint has no record for any of the shard's partitions: nothing can prove
       the transaction, and nothing needs to — the retry republishes zero records, the
       marker, and (last shard) the same group offsets again, which changes no output.
    """
    rows = {row.shard for row in ledger.get(pipeline.name, cp.checkpoint_id).shards}
    if shard not in rows:
        return -1
    staged = [p for p in plan.partitions_of(shard) if sum(f.records for f in manifest.files.get(p, [])) > 0]
    if not staged:
        return -1
    config = librdkafka_config(pipeline.kafka)
    return audit.last_published_checkpoint(config, plan.sink_topic, staged[0], pipeline.name, identity)


def _publish_shard(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    manifest: staging.Manifest,
    shard: int,
    plan: CommitPlan,
    owner: str,
) -> tuple[int, bool]:
    """Publish one shard of the frozen ``plan`` exactly once. Returns (records produced,
    skipped by marker)."""
    config = librdkafka_config(pipeline.kafka)
    txn_id = names.plan_transactional_id(plan, pipeline.name, shard)
    sink = plan.sink_topic
    where = f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}, shard {shard}: "
    timeout_s = pipeline.transaction_timeout_ms / 1000
    partitions = [p for p in plan.partitions_of(shard) if p in manifest.files]
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

    identity = ledger.get_pipeline(pipeline.name).identity
    last_failure = ""
    topic_max = admin.topic_max_message_bytes(config, pipeline.sink_topic, pipeline.sink_max_message_bytes)
    for _round in range(MAX_SHARD_ROUNDS):
        failures = DeliveryFailures()
        producer = new_producer(
            config, txn_id, pipeline.transaction_timeout_ms, on_failure=failures, topic_max_bytes=topic_max
        )
        try:
            kafka_call("metadata", connect, producer, sink, timeout_s, where=where)
            kafka_call("init_transactions", producer.init_transactions, timeout_s, where=where)
            # Only this shard's marker: another shard's may sit in a transaction a killed
            # committer left open (not fenced yet: its init_transactions comes with its
            # turn), and a stable read of it would wait for that transaction's timeout.
            # Foreign markers on other shards are refused at plan time and at their turn.
            done = marker_position(pipeline, shard, plan, identity=identity)
            if done < 0:  # no marker (never written, expired, or the topic re-created)
                done = _published_by_output(pipeline, ledger, cp, manifest, shard, plan, identity)
            if done >= cp.checkpoint_id:
                record(state="COMMITTED", records=expected)
                return 0, True
            # Every committer uses the pinned prefix, so init_transactions above fenced any
            # other; the lease (database clock) only keeps live committers from taking turns.
            ledger.acquire_commit_lease(
                pipeline.name, cp.checkpoint_id, owner=owner, ttl_s=2 * timeout_s + 30
            )
            record(state="PENDING", records=expected)
            kafka_call("begin_transaction", producer.begin_transaction, where=where)
            produced = 0
            ckpt_header = names.provenance_checkpoint_field(
                pipeline.name, cp.checkpoint_id, identity
            ).encode()
            for partition in partitions:
                batches = staging.iter_batches(cp.staging_location or "", manifest.files[partition])
                produced += produce_staged(producer, sink, partition, batches, ckpt_header, where=where)
                fault_point("commit.after_begin")
            # Everything acknowledged by the broker before the commit step (commit would
            # flush anyway; this makes the crash point below well-defined).
            producer.flush(timeout_s)
            if failures:  # a refused record: the transaction can only be aborted now
                raise Abortable(failures.describe())
            fault_point("commit.before_commit_txn")
            marker = {(sink, shard): cp.checkpoint_id}
            kafka_call(
                "send_offsets_to_transaction(marker)",
                producer.send_offsets_to_transaction,
                offsets(marker, names.marker_metadata(identity)),  # names the writing ledger
                group_metadata(config, plan.marker_group),
                timeout_s,
                where=where,
            )
            if shard == plan.shards - 1:  # the plan's last shard also moves the pipeline's group
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
                    f"{sink!r} lowered max.message.bytes (or the broker its "
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
    reason: str,
    actor: Actor | None,
) -> None:
    """Abort ``cp`` after a verified staging mismatch, safely (core/abort.py: refused while a
    live committer holds the lease, every shard id fenced before the markers are read), and
    raise :class:`StagingError` saying so."""
    from airflow_provider_eo.core.abort import abort_checkpoint

    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason=reason, actor=actor)
    raise StagingError(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}. Nothing was "
        "published; the checkpoint is ABORTED and its range will be replanned by the next run."
    )


def _staged_partitions(cp: CheckpointRecord) -> int | None:
    """The partition count a checkpoint's output was staged for (None when unreadable: the
    verification below then decides)."""
    try:
        return staging.read_manifest(cp.staging_location or "").sink_partitions
    except (StagingError, OSError):
        return None


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
    # The frozen plan, never today's settings (a checkpoint from before ledger revision
    # 0002 freezes one now, for the partition count its output was staged for). Refuses a
    # process with another transactional-id prefix, and a sink that lost partitions.
    plan = frozen_commit_plan(
        pipeline,
        ledger,
        cp,
        staged_partitions=_staged_partitions(cp) if cp.commit_plan is None else None,
        actor=actor,
    )
    sink_partitions = plan.sink_partitions
    shards = plan.shards
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
                f"the commit plan of sink topic {plan.sink_topic!r} has {sink_partitions} "
                f"partitions, the staged output was partitioned for {manifest.sink_partitions}"
            )
        staging.verify(cp.staging_location or "", manifest)
    # StagingUnreadable (an I/O error) is not caught: the storage did not answer, the staged
    # output may be intact, so the commit fails retryably and nothing is aborted. Only a
    # verified mismatch (count, checksum, another checkpoint's manifest) aborts.
    except StagingError as exc:
        _abort_if_unpublished(pipeline, ledger, cp, f"staged output failed verification ({exc})", actor)
        raise  # unreachable: the helper always raises
    owner = owner or names.lease_owner(pipeline)
    published = skipped = 0
    for shard in range(shards):
        n, was_done = _publish_shard(pipeline, ledger, cp, manifest, shard, plan, owner)
        published += n
        skipped += int(was_done)
    fault_point("commit.before_ledger")
    cp = ledger.mark_committed(pipeline.name, checkpoint_id, actor=actor)
    cleanup_staging(pipeline, cp)
    return CommitResult(cp, published, skipped, time.monotonic() - started)
