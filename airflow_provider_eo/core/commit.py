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
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from airflow_provider_eo import names
from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.core.commit_checks import (
    check_markers_before_publish,
    check_other_deployments_at_commit,
    commit_plan_of,
)
from airflow_provider_eo.core.commit_lease import lease_ttl, take_commit_lease
from airflow_provider_eo.core.commit_mode import NEW_APPLICATION_FACTOR, resolve_commit_mode
from airflow_provider_eo.core.commit_on_spark import publish_on_spark
from airflow_provider_eo.core.commit_shards import LedgerShardHooks, shard_committable
from airflow_provider_eo.core.commit_staging import abort_if_unpublished, cleanup_staging, verified_manifest
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.shard import KafkaClients, Publisher, ShardRunner, commit_shard
from airflow_provider_eo.errors import (
    ConfigError,
    LedgerBehindSink,
    NotPrepared,
    StagingError,
    StagingNotVisible,
)
from airflow_provider_eo.kafka.admin import KAFKA_MAX_MESSAGE_BYTES
from airflow_provider_eo.kafka.publisher import PRODUCERS
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointRecord,
    CheckpointState,
    CommitPlan,
    Ledger,
    ShardState,
)
from airflow_provider_eo.ledger.errors import CheckpointConflict, CommitLeaseHeld
from airflow_provider_eo.pipeline import Pipeline

# The names moved to the commit's other modules stay importable from here.
__all__ = [
    "BY_ANOTHER",
    "NEW_APPLICATION_FACTOR",
    "CommitResult",
    "LedgerShardHooks",
    "cleanup_staging",
    "commit_checkpoint",
    "resolve_commit_mode",
    "shard_committable",
    "take_commit_lease",
]


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
    clients: KafkaClients | None = None,
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
    clients = kafka_clients(pipeline.kafka, clients)
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
    plan = commit_plan_of(pipeline, ledger, cp, registered, actor=actor, clients=clients)
    shards = plan.shards
    owner = owner or names.lease_owner(actor)
    identity = registered.identity
    markers = check_markers_before_publish(pipeline, registered, cp, plan, clients)
    try:
        manifest = verified_manifest(pipeline, cp, plan)
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
        abort_if_unpublished(
            pipeline, ledger, cp, f"staged output failed verification ({exc})", actor, clients
        )
        raise  # unreachable: the helper always raises
    check_other_deployments_at_commit(pipeline, plan, registered.identity, clients)
    topic_max = clients.topic_max_message_bytes(pipeline.sink_topic, pipeline.sink_max_message_bytes)
    dead_letter_max = None
    if manifest.dead_letters and manifest.dead_letter_topic:
        dead_letter_max = clients.topic_max_message_bytes(manifest.dead_letter_topic, KAFKA_MAX_MESSAGE_BYTES)
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
        take_commit_lease(ledger, pipeline.name, checkpoint_id, owner=owner, ttl_s=lease_ttl(to_publish))
    if mode == "spark":
        if runner is None:
            raise ConfigError(
                f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}: commit_mode 'spark' "
                "needs Spark, and this caller gave no shard runner. Use `eo commit --commit-mode "
                "spark`, EoCommitOperator(commit_mode='spark'), or commit_mode='local'."
            )
        if to_publish:
            publishers += publish_on_spark(ledger, cp, to_publish, owner=owner, runner=runner)
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
