"""Commit a PREPARED checkpoint: publish its staged output in Kafka transactions.

Every try uses the checkpoint's commit plan, frozen when it was planned (sink topic, its
partition count, the shard -> partition map, the transactional-id prefix, the marker group),
never the current settings; a process configured with another transactional-id prefix than
the one pinned for the pipeline is refused before anything is produced.

Per commit shard of the plan, in shard order (``notifyCheckpointComplete`` -> ``commit``),
a :class:`~airflow_provider_eo.core.shard.ShardTransaction` on the shard's frozen
:class:`~airflow_provider_eo.core.shard.ShardCommittable`; this module adds the ledger
(:class:`LedgerShardHooks`):

1. A fresh producer with the shard's stable transactional id; ``init_transactions``
   fences any zombie and aborts whatever an earlier attempt left open. A producer whose
   last transaction of the id committed cleanly in this process is used again instead
   (:class:`~airflow_provider_eo.kafka.publisher.ProducerPool`; a stream commits every
   checkpoint this way): if another process fenced it meanwhile, or its round fails for
   any other reason that would end the shard, the round is redone with a fresh producer
   and ``init_transactions`` (core/shard.py).
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

Where the shards run is the commit mode (:func:`resolve_commit_mode`): ``local`` runs them
in this process, one after another; ``spark`` runs each in a Spark task on an executor
(spark/commit.py), so this process publishes no record: every shard but the plan's last in
parallel, then the last one, whose transaction moves the pipeline's consumer group, only
after the driver saw every other shard committed. Both modes keep the same markers and
ledger rows, so a checkpoint half committed in one mode is finished by the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaException

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.markers import decide_marker
from airflow_provider_eo.core.plan import check_commit_plan, frozen_commit_plan
from airflow_provider_eo.core.shard import (
    REAL_KAFKA,
    KafkaClients,
    Publisher,
    ShardCommittable,
    ShardFailure,
    ShardRunner,
    ShardTask,
    commit_shard,
)
from airflow_provider_eo.core.sink_guard import (
    check_commit_markers,
    mark_clear,
    other_deployments,
    other_deployments_error,
    recently_clear,
)
from airflow_provider_eo.errors import (
    CommitError,
    CommitLeaseLost,
    ConfigError,
    EoError,
    LedgerBehindSink,
    NotPrepared,
    StagingError,
    StagingNotVisible,
    StagingUnreadable,
)
from airflow_provider_eo.kafka.admin import KAFKA_MAX_MESSAGE_BYTES
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import PRODUCERS, with_dead_letter_limits
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointRecord,
    CheckpointState,
    CommitPlan,
    Ledger,
    PipelineRecord,
    ShardState,
)
from airflow_provider_eo.ledger.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CommitLeaseHeld,
    LedgerUnavailable,
)
from airflow_provider_eo.pipeline import COMMIT_MODES, Pipeline
from airflow_provider_eo.processes import process_gone

log = logging.getLogger(__name__)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """What one commit call did."""

    checkpoint: CheckpointRecord
    published: int  # records produced by this call
    shards_skipped: int  # shards whose marker already showed the checkpoint
    seconds: float
    note: str = ""
    mode: Literal["local", "spark"] = "local"  # where the shards ran
    publishers: tuple[Publisher, ...] = ()  # the process that published each shard
    # Another committer finished the checkpoint while this call ran (:data:`BY_ANOTHER`).
    by_another: bool = False

    def summary(self) -> dict[str, object]:
        """The checkpoint's summary plus what this call did (``eo commit --json``)."""
        return {
            **self.checkpoint.summary(),
            "published": self.published,
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "committed_by_another": self.by_another,
            "commit_mode": self.mode,
            "committer": {"host": socket.gethostname(), "pid": os.getpid()},
            "publishers": [p.as_dict() for p in sorted(self.publishers, key=lambda p: p.shard)],
        }


#: A commit that must start its own Spark application (``eo commit`` alone, a spark-submit
#: from Airflow) pays 10-18 s before the first record (measured: docs/benchmarks.md), what
#: a local commit publishes in 5-10M records: ``auto`` needs this many times the threshold.
NEW_APPLICATION_FACTOR = 10


def resolve_commit_mode(
    requested: str,
    *,
    master: str,
    records: int,
    min_records: int,
    session_running: bool = True,
    executors_elsewhere: bool = True,
) -> Literal["local", "spark"]:
    """Where a commit runs. ``local`` and ``spark`` are taken as given. ``auto`` is ``spark``
    only when the Spark cores are worth it (docs/benchmarks.md, commit scale):

    - the master is a cluster (not ``local``/``local[N]``/``local-cluster``), and
    - the checkpoint has at least ``min_records`` records (a Spark job costs ~0.8 s more
      than a local commit; one core publishes ~500k records/s), and
    - the running session's executors are not all on this host (there, Spark adds
      processes but no cores: measured slower at 4M on 2 cores), and
    - with no session running yet, the checkpoint has :data:`NEW_APPLICATION_FACTOR` times
      ``min_records`` (the application's start is paid first).

    Else ``local``.
    """
    if requested not in COMMIT_MODES:
        raise ValueError(f"commit mode {requested!r} is not one of {', '.join(COMMIT_MODES)}")
    if requested == "local":
        return "local"
    if requested == "spark":
        return "spark"
    clustered = not (master == "local" or master.startswith(("local[", "local-")))
    if not clustered or records < min_records:
        return "local"
    if session_running and not executors_elsewhere:
        return "local"
    if not session_running and records < NEW_APPLICATION_FACTOR * min_records:
        return "local"
    return "spark"


def shard_committable(
    pipeline: Pipeline,
    identity: str,
    cp: CheckpointRecord,
    manifest: staging.Manifest,
    plan: CommitPlan,
    shard: int,
    *,
    topic_max_bytes: int | None,
    dead_letter_max_bytes: int | None = None,
) -> ShardCommittable:
    """The frozen committable of one shard of ``cp``: the plan's transactional id, sink and
    marker group, the shard's staged files, and (the plan's last shard only) the pipeline
    group's offsets at the checkpoint's ends and the checkpoint's dead letters, with its
    producer sized for the dead-letter topic's ``dead_letter_max_bytes`` too."""
    last = shard == plan.shards - 1  # the plan's last shard also moves the pipeline's group
    kafka = librdkafka_config(pipeline.kafka)
    if last and manifest.dead_letters and dead_letter_max_bytes is not None:
        kafka = with_dead_letter_limits(kafka, dead_letter_max_bytes)
    return ShardCommittable(
        pipeline=pipeline.name,
        identity=identity,
        checkpoint_id=cp.checkpoint_id,
        shard=shard,
        transactional_id=names.plan_transactional_id(plan, pipeline.name, shard),
        sink_topic=plan.sink_topic,
        staging_location=cp.staging_location or "",
        parts=tuple((p, tuple(manifest.files[p])) for p in plan.partitions_of(shard) if p in manifest.files),
        marker_group=plan.marker_group,
        group_id=pipeline.group_id if last else None,
        group_offsets=tuple((r.topic, r.partition, r.end) for r in cp.ranges) if last else (),
        kafka=tuple(sorted(kafka.items())),
        transaction_timeout_ms=pipeline.transaction_timeout_ms,
        topic_max_bytes=topic_max_bytes,
        dead_letter_topic=manifest.dead_letter_topic if last else None,
        dead_letters=tuple(manifest.dead_letters) if last else (),
        staging_store=staging_fs.store_for(pipeline),
    )


def _committed_by_markers(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    plan: CommitPlan,
    actor: Actor | None,
    started: float,
) -> CommitResult:
    """Record a checkpoint every shard of which the commit markers show published (the
    shard rows with the prepare's counts) and mark it COMMITTED; nothing is sent."""
    for shard in range(plan.shards):
        ledger.record_shard(
            pipeline.name,
            cp.checkpoint_id,
            shard,
            transactional_id=names.plan_transactional_id(plan, pipeline.name, shard),
            producer_id=None,
            producer_epoch=None,
            state="COMMITTED",
            records=int(cp.shard_counts.get(shard, 0)),
        )
    done = ledger.mark_committed(pipeline.name, cp.checkpoint_id, actor=actor)
    return CommitResult(
        done,
        0,
        plan.shards,
        time.monotonic() - started,
        note="published already (every commit marker shows it); its staging was gone",
    )


class LedgerShardHooks:
    """The ledger's part of one shard's transaction in a local commit: the lease and the
    PENDING row before ``begin_transaction``, the COMMITTED row after, with the seconds the
    transaction that published took (from its own ``before_begin``: a failed round before it
    does not count; the plan sizes checkpoints from these, core/plan.py)."""

    #: The clock the publish time is measured with (unit tests move it by hand).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self, ledger: Ledger, committable: ShardCommittable, *, owner: str, row_before: bool | None = None
    ) -> None:
        """:param row_before: whether the ledger had a row for the shard when this commit
        read the checkpoint (None: not known, :meth:`may_have_published` reads it)."""
        self.ledger = ledger
        self.c = committable
        self.owner = owner
        self.row_before = row_before
        self._began: float | None = None  # the clock at this process's latest before_begin

    def _record(self, *, state: str, records: int, publish_s: float | None = None) -> None:
        self.ledger.record_shard(
            self.c.pipeline,
            self.c.checkpoint_id,
            self.c.shard,
            transactional_id=self.c.transactional_id,
            producer_id=None,
            producer_epoch=None,
            state=state,
            records=records,
            publish_s=publish_s,
        )

    def may_have_published(self) -> bool:
        """A shard row exists: a try got as far as ``begin_transaction``.

        With ``row_before`` (read with the checkpoint at the start of this commit) no read:
        a row written since by another committer that began a transaction is covered all
        the same, since its transaction is either aborted by this shard's fence or committed
        with the marker, which the caller read first (a spark-mode commit's tasks rely on
        the same early read)."""
        if self._began is not None:
            return True  # this process recorded the shard PENDING
        if self.row_before is not None:
            return self.row_before
        rows = self.ledger.get(self.c.pipeline, self.c.checkpoint_id).shards
        return any(row.shard == self.c.shard for row in rows)

    def before_begin(self) -> None:
        """Take the commit lease (the database's clock), then record the shard PENDING.

        Every committer uses the pinned prefix, so the fence before this already stopped any
        other; the lease only keeps live committers from taking turns."""
        self._began = self.clock()
        self.ledger.acquire_commit_lease(
            self.c.pipeline, self.c.checkpoint_id, owner=self.owner, ttl_s=2 * self.c.timeout_s + 30
        )
        self._record(state="PENDING", records=self.c.records)

    def committed(self, records: int) -> None:
        """Record the shard COMMITTED, with its publish time when this process published it
        (none when a marker showed an earlier process's transaction)."""
        seconds = None if self._began is None else max(0.0, self.clock() - self._began)
        self._record(state="COMMITTED", records=records, publish_s=seconds)


def _lease_ttl(committables: list[ShardCommittable]) -> float:
    """How long one take or renewal of the commit lease lasts: a shard's transaction is open at
    most its timeout; twice that and 30 s more, so a live committer never loses it."""
    return 2 * max(c.timeout_s for c in committables) + 30


def take_commit_lease(ledger: Ledger, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float) -> None:
    """Hold the commit lease of ``checkpoint_id`` for ``owner`` before any shard is fenced.

    Refused (:class:`CommitLeaseHeld`, naming the holder; nothing fenced or published) while
    another committer holds it live. Taken over at once only from a holder that is certainly
    gone: a committer process of this machine (same boot, same pid namespace) that no longer
    runs (:func:`airflow_provider_eo.processes.process_gone`; e.g. the killed try before an
    Airflow retry on the same host, a stream restarted after a crash). Anything else (another
    host, a paused process) keeps its lease until it runs out, or an explicit
    ``eo recover --force-live``. The take-over is recorded (the lease event's
    ``previous_owner``); the shard's fence then aborts whatever the dead one left open."""
    try:
        ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)
    except CommitLeaseHeld as held:
        process = names.lease_owner_process(held.owner or "")
        if process is None or not process_gone(process[1], process[2]):
            raise
        ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s, replacing=held.owner)
        log.warning(
            "pipeline %r, checkpoint %s: took the commit lease over from %r, whose process is gone",
            pipeline,
            checkpoint_id,
            held.owner,
        )


def _abort_if_unpublished(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    reason: str,
    actor: Actor | None,
    clients: KafkaClients = REAL_KAFKA,
) -> None:
    """Abort ``cp`` after a verified staging mismatch, safely (core/abort.py: refused while a
    live committer holds the lease, every shard id fenced before the markers are read), and
    raise :class:`StagingError` saying so. Refused (:class:`AbortRefused`, the checkpoint stays
    PREPARED) once a shard published it: recorded COMMITTED in the ledger, shown by its
    marker, or, its marker gone, by the sink's committed output."""
    abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason=reason, actor=actor, clients=clients)
    raise StagingError(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: {reason}. Nothing was "
        "published; the checkpoint is ABORTED and its range will be replanned by the next run."
    )


def _staged_partitions(cp: CheckpointRecord, store: staging_fs.StagingStore | None = None) -> int | None:
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


#: The note of a commit that found its checkpoint committed by another committer meanwhile.
BY_ANOTHER = (
    "already committed by another committer while this one ran (each record once: the "
    "markers and the ledger agree); nothing more to do"
)


def commit_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    actor: Actor | None = None,
    owner: str | None = None,
    clients: KafkaClients = REAL_KAFKA,
    commit_mode: str | None = None,
    runner: ShardRunner | None = None,
    fallback: Callable[[str], None] | None = None,
) -> CommitResult:
    """Publish a PREPARED checkpoint exactly once and mark it COMMITTED.

    Idempotent: committing a COMMITTED checkpoint does nothing; a retry after any crash
    publishes only the shards the ledger does not record COMMITTED and whose marker does not
    show the checkpoint yet.

    A committer that finds the checkpoint committed by another committer while it ran (two
    Airflow tries, a stream and an ``eo commit``: the other one committed it, and perhaps
    later checkpoints, whose markers are past this one) returns with ``by_another`` set and
    :data:`BY_ANOTHER` as its note: a success, nothing published by this call. What such a
    committer meets on its way (markers past its checkpoint, a lease or shard row of a
    checkpoint no longer PREPARED, staging already cleaned up) is judged by the ledger read
    again: only a checkpoint still PREPARED in the ledger makes them the errors they are
    (a marker past a PREPARED checkpoint is :class:`LedgerBehindSink`: a ledger restored
    from an older copy).

    :param clients: the Kafka side (producers, markers); unit tests pass a fake.
    :param commit_mode: ``local``, ``spark`` or ``auto`` (default: the pipeline's).
    :param runner: where a spark-mode commit runs its shards (spark/commit.py's
        ``SparkShardRunner``); without one, ``auto`` commits locally and ``spark`` is refused.
    :param fallback: commit ``spark`` locally instead when there is no runner or it cannot
        run (``runner.unavailable()``), telling this callable why in one line (recovery and
        backfill: the checkpoint must be finished whatever the mode).
    """
    started = time.monotonic()
    owner = owner or names.lease_owner(actor)
    try:
        return _commit_prepared(
            pipeline,
            ledger,
            checkpoint_id,
            actor=actor,
            owner=owner,
            clients=clients,
            commit_mode=commit_mode,
            runner=runner,
            fallback=fallback,
        )
    except (LedgerBehindSink, CheckpointConflict, StagingNotVisible):
        now = ledger.get(pipeline.name, checkpoint_id)
        if now.state is not CheckpointState.COMMITTED:
            raise
        return CommitResult(now, 0, 0, time.monotonic() - started, note=BY_ANOTHER, by_another=True)
    except CommitLeaseHeld:
        raise  # another committer's lease: not ours to release
    except BaseException:
        # This committer failed or is exiting (an error, SystemExit, an interrupt) and
        # publishes no more (a SIGKILL never gets here: its lease runs out or its process is
        # seen gone). Its lease is given up, so a retry (the next Airflow try, another process)
        # need not wait for it to run out; whatever it left open is fenced by the retry's
        # init_transactions.
        with contextlib.suppress(Exception):
            ledger.release_commit_lease(pipeline.name, checkpoint_id, owner=owner)
        raise


def _commit_prepared(
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    actor: Actor | None,
    owner: str | None,
    clients: KafkaClients,
    commit_mode: str | None,
    runner: ShardRunner | None,
    fallback: Callable[[str], None] | None,
) -> CommitResult:
    """:func:`commit_checkpoint`'s steps."""
    require_applied(pipeline, where="the commit")
    requested = commit_mode or pipeline.commit_mode
    started = time.monotonic()
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state is CheckpointState.COMMITTED:
        return CommitResult(cp, 0, 0, 0.0, note="already COMMITTED")
    if cp.state is not CheckpointState.PREPARED:
        raise NotPrepared(
            f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}, not "
            "PREPARED; run (or retry) its prepare step first"
        )
    registered = ledger.get_pipeline(pipeline.name)
    # The frozen plan, never today's settings (a checkpoint from before ledger revision
    # 0002 freezes one now, for the partition count its output was staged for). Refuses a
    # process with another transactional-id prefix, and a sink that lost partitions.
    if cp.commit_plan is not None and registered.transactional_id_prefix == pipeline.transactional_id_prefix:
        # This process's prefix is the pinned one (a pin never changes): pinning it again
        # would change nothing, so only the plan is checked (no ledger write).
        plan = cp.commit_plan
        check_commit_plan(pipeline, cp, plan)
    else:
        plan = frozen_commit_plan(
            pipeline,
            ledger,
            cp,
            staged_partitions=_staged_partitions(cp, staging_fs.store_for(pipeline))
            if cp.commit_plan is None
            else None,
            actor=actor,
        )
    sink_partitions = plan.sink_partitions
    shards = plan.shards
    owner = owner or names.lease_owner(actor)
    identity = registered.identity
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
    config = librdkafka_config(pipeline.kafka)
    readable = [(plan.sink_topic, s) for s in range(shards)]
    try:
        found = clients.committed_marks(config, plan.marker_group, readable, stable=False)
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
    try:
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
    # StagingUnreadable (an I/O error) is not caught: the storage did not answer, the staged
    # output may be intact, so the commit fails retryably and nothing is aborted. Only a
    # verified mismatch (count, checksum, another checkpoint's manifest) aborts.
    except StagingNotVisible:
        # Every shard's marker shows this checkpoint published (a ledger restored from a
        # copy taken while it was PREPARED, whose staging the newer ledger already removed):
        # nothing is left to publish, so the ledger catches up; else retry where it is visible.
        if len(markers) < shards or any(m < checkpoint_id for m in markers.values()):
            raise
        return _committed_by_markers(pipeline, ledger, cp, plan, actor, started)
    except StagingError as exc:
        _abort_if_unpublished(
            pipeline, ledger, cp, f"staged output failed verification ({exc})", actor, clients
        )
        raise  # unreachable: the helper always raises
    # Another deployment of this pipeline name (another ledger) that published to another
    # sink since this checkpoint was planned: refused before its committers and ours fence
    # each other (they share transactional ids). Best effort, as above: every plan checks it.
    bootstrap = str(config.get("bootstrap.servers"))
    if not recently_clear("commit", bootstrap, plan.marker_group, identity):
        try:
            elsewhere = clients.marks_elsewhere(config, plan.marker_group, plan.sink_topic)
        except (EoError, KafkaException, TimeoutError):
            elsewhere = None
        others = other_deployments(elsewhere or {}, sink_topic=plan.sink_topic, identity=identity)
        if others:
            raise other_deployments_error(pipeline.name, plan.marker_group, plan.sink_topic, identity, others)
        if elsewhere is not None:
            mark_clear("commit", bootstrap, plan.marker_group, identity)
    topic_max = clients.topic_max_message_bytes(
        librdkafka_config(pipeline.kafka), pipeline.sink_topic, pipeline.sink_max_message_bytes
    )
    dead_letter_max = None
    if manifest.dead_letters and manifest.dead_letter_topic:
        dead_letter_max = clients.topic_max_message_bytes(
            librdkafka_config(pipeline.kafka), manifest.dead_letter_topic, KAFKA_MAX_MESSAGE_BYTES
        )
    committables = [
        shard_committable(
            pipeline,
            identity,
            cp,
            manifest,
            plan,
            shard,
            topic_max_bytes=topic_max,
            dead_letter_max_bytes=dead_letter_max,
        )
        for shard in range(shards)
    ]
    mode = resolve_commit_mode(
        requested,
        master=runner.master if runner is not None else "local",
        records=manifest.records,
        min_records=pipeline.spark_commit_min_records,
        session_running=runner.session_running if runner is not None else False,
        executors_elsewhere=runner.executors_elsewhere if runner is not None else False,
    )
    if mode == "spark" and fallback is not None:
        why = "this caller has no Spark shard runner" if runner is None else runner.unavailable()
        if why is not None:
            fallback(
                f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: commit_mode 'spark', "
                f"but {why}: committing its shards in this process instead (both modes keep the "
                "same markers and ledger rows)"
            )
            mode = "local"
    # A shard the ledger records COMMITTED is published for good (its row is written only
    # after its transaction committed, or its marker showed it): never run again, whatever
    # its marker (expired) or a read-back (the sink's retention) would show today.
    done_rows = {row.shard for row in cp.shards if row.state is ShardState.COMMITTED}
    publishers: list[Publisher] = [
        Publisher(shard=c.shard, host=socket.gethostname(), pid=os.getpid(), records=0, skipped=True)
        for c in committables
        if c.shard in done_rows
    ]
    to_publish = [c for c in committables if c.shard not in done_rows]
    if to_publish and mode == "local":
        # Before the first shard's fence: a live committer of this checkpoint (another
        # process) is refused here, before its transaction could be fenced.
        take_commit_lease(ledger, pipeline.name, checkpoint_id, owner=owner, ttl_s=_lease_ttl(to_publish))
    if mode == "spark":
        if runner is None:
            raise ConfigError(
                f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: commit_mode 'spark' "
                "needs Spark, and this caller gave no shard runner. Use `eo commit --commit-mode "
                "spark`, EoCommitOperator(commit_mode='spark'), or commit_mode='local'."
            )
        if to_publish:
            publishers += _publish_on_spark(ledger, cp, to_publish, owner=owner, runner=runner)
    else:
        rows = {row.shard for row in cp.shards}
        for committable in to_publish:
            hooks = LedgerShardHooks(ledger, committable, owner=owner, row_before=committable.shard in rows)
            # The shard's producer is kept for the next checkpoint after a clean commit.
            result = commit_shard(committable, hooks, clients, pool=PRODUCERS)
            publishers.append(
                Publisher(
                    shard=committable.shard,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    records=result.records,
                    executor="local",
                    skipped=result.skipped,
                )
            )
    fault_point("commit.before_ledger")
    cp = ledger.mark_committed(pipeline.name, checkpoint_id, actor=actor)
    cleanup_staging(pipeline, ledger, cp, registered=registered)
    return CommitResult(
        cp,
        sum(p.records for p in publishers),
        sum(int(p.skipped) for p in publishers),
        time.monotonic() - started,
        mode=mode,
        publishers=tuple(publishers),
    )


class _LeaseKeeper(threading.Thread):
    """Renews the commit lease while a spark-mode commit's jobs run (the driver holds it for
    all of its shards; a commit on another host waits for it, as in local mode).

    A renewal the ledger does not answer (:class:`LedgerUnavailable`) is retried until the
    lease would lapse (:attr:`margin_s` before it, on this process's clock, counted from
    before the last renewal that succeeded). Then, or at once when the lease was taken over
    (an abort, another committer), the checkpoint's Spark jobs are cancelled, so no queued
    task of them begins after the lease, and :attr:`lost` says why. A task that begins all
    the same (this driver paused, a task already past Spark's scheduler) is refused by the
    abort mark an abort leaves (core/abort_marks.py); the keeper only keeps that rare.
    """

    #: The clock the lease's age is measured with (unit tests may replace it).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        ledger: Ledger,
        pipeline: str,
        checkpoint_id: int,
        owner: str,
        ttl_s: float,
        *,
        cancel: Callable[[], None],
    ) -> None:
        super().__init__(name=f"eo-commit-lease-{pipeline}-{checkpoint_id}", daemon=True)
        self.args = (ledger, pipeline, checkpoint_id, owner, ttl_s)
        self.cancel = cancel
        self.stop = threading.Event()
        self.margin_s = ttl_s / 6
        self.renewed = self.clock()  # the lease was taken right before the keeper starts
        #: Why the lease was given up (None while it is held).
        self.lost: str | None = None

    def run(self) -> None:
        ledger, pipeline, checkpoint_id, owner, ttl_s = self.args
        wait = ttl_s / 3
        while not self.stop.wait(wait):
            asked = self.clock()
            try:
                ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)
            except LedgerUnavailable as exc:
                left = self.renewed + ttl_s - self.clock()
                if left <= self.margin_s:
                    self._lose(
                        f"the ledger did not answer for {ttl_s - left:.0f} s, so the lease could "
                        f"not be renewed before it lapses (last error: {exc})"
                    )
                    return
                # Retry sooner, so a short outage does not cost the lease.
                wait = max(ttl_s / 60, min(ttl_s / 3, (left - self.margin_s) / 3))
                log.warning(
                    "pipeline %r, checkpoint %s: commit lease not renewed, retrying: %s",
                    pipeline,
                    checkpoint_id,
                    exc,
                )
                continue
            except EoError as exc:
                self._lose(f"the lease was taken over or the checkpoint moved on ({exc})")
                return
            self.renewed, wait = asked, ttl_s / 3

    def _lose(self, why: str) -> None:
        self.lost = why
        if self.stop.is_set():
            return  # the jobs are over: nothing to cancel
        try:
            self.cancel()
        except Exception as exc:  # the tasks are still refused by the abort marks
            log.warning("commit jobs not cancelled: %s", exc)


def _raise_shard_failure(c: ShardCommittable, outcome: ShardFailure | BaseException) -> None:
    """Re-raise a shard task's failure in the driver as the eo error it was, naming the
    pipeline, checkpoint and shard (and where it ran)."""
    from airflow_provider_eo import errors

    if isinstance(outcome, ShardFailure):
        cls = getattr(errors, outcome.error, None)
        if isinstance(cls, type) and issubclass(cls, EoError):
            raise cls(f"{outcome.message} (in the commit task on {outcome.host}, pid {outcome.pid})")
        raise CommitError(
            f"{c.where}the commit task on {outcome.host} (pid {outcome.pid}) failed: "
            f"{outcome.error}: {outcome.message}. The checkpoint stays PREPARED; retry the commit "
            "(the shard's marker prevents duplicates)."
        )
    first = str(outcome).strip().splitlines()[0] if str(outcome).strip() else type(outcome).__name__
    raise CommitError(
        f"{c.where}the Spark job that commits this shard failed ({type(outcome).__name__}: "
        f"{first[:500]}). Nothing of an unfinished transaction is visible; the checkpoint stays "
        "PREPARED: retry the commit (the shard's marker prevents duplicates)."
    ) from outcome


def _publish_on_spark(
    ledger: Ledger,
    cp: CheckpointRecord,
    committables: list[ShardCommittable],
    *,
    owner: str,
    runner: ShardRunner,
) -> list[Publisher]:
    """Run the shards as Spark tasks: all but the plan's last in parallel, then the last
    (the one that moves the pipeline's group) once every other shard is committed, so the
    group's offsets never pass output that is not committed. The ledger is written here, in
    the driver: the lease and every shard's PENDING row before any task starts, each shard's
    COMMITTED row as its outcome arrives."""
    name, cid = committables[0].pipeline, cp.checkpoint_id
    rows = {row.shard: row for row in ledger.get(name, cid).shards}
    ttl = _lease_ttl(committables)
    taken = _LeaseKeeper.clock()  # the lease's age counts from before it was asked for
    take_commit_lease(ledger, name, cid, owner=owner, ttl_s=ttl)

    def row(c: ShardCommittable, state: str, records: int, publish_s: float | None = None) -> None:
        ledger.record_shard(
            name,
            cid,
            c.shard,
            transactional_id=c.transactional_id,
            producer_id=None,
            producer_epoch=None,
            state=state,
            records=records,
            publish_s=publish_s,
        )

    for c in committables:
        if c.shard not in rows or rows[c.shard].state.value != "COMMITTED":
            row(c, "PENDING", c.records)
    by_shard = {c.shard: c for c in committables}
    publishers: list[Publisher] = []

    def record(outcome: Publisher | ShardFailure) -> None:
        if isinstance(outcome, Publisher):
            c = by_shard[outcome.shard]
            row(c, "COMMITTED", c.records if outcome.skipped else outcome.records, outcome.publish_s)
            publishers.append(outcome)

    keeper = _LeaseKeeper(ledger, name, cid, owner, ttl, cancel=lambda: runner.cancel(name, cid))
    keeper.renewed = taken
    keeper.start()
    try:
        for phase in (committables[:-1], committables[-1:]):
            tasks = [ShardTask(c, row_before=c.shard in rows) for c in phase]
            outcomes = runner.run(tasks, record) if keeper.lost is None else []
            if keeper.lost is not None:
                done = sorted(p.shard for p in publishers)
                raise CommitLeaseLost(
                    f"pipeline {name!r}, checkpoint {cid}: this commit gave up its commit lease "
                    f"({keeper.lost}); its Spark jobs were cancelled, so no queued commit task "
                    f"begins. Shards committed: {done or 'none'} (their markers show it); "
                    "nothing of an unfinished shard is visible. Retry the commit once the ledger "
                    "answers (the markers prevent duplicates); if an abort took it over, its "
                    "range is replanned."
                )
            for shard, outcome in outcomes:
                if not isinstance(outcome, Publisher):
                    _raise_shard_failure(by_shard[shard], outcome)
    finally:
        keeper.stop.set()
    return publishers
