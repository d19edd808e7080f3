"""``eo recover``: resolve lingering open transactions of a pipeline safely.

An open transaction on a sink partition holds back every ``read_committed`` consumer
(the last stable offset stays below the high watermark) until the broker's transaction
timeout aborts it. One of ours is left by a committer that died with its transaction open
(a killed commit task, a zombie). Recovery, in order:

0. The fence lease (core/fencing.py) is taken: refused while a committer of any checkpoint
   holds a live commit lease ("checkpoint N is being committed by OWNER until T; wait, or stop
   it first"), since the ids fenced below are that committer's too (one per commit shard,
   shared by all checkpoints). While it is held no committer begins; it is renewed before
   every id and by a heartbeat, and released at the end. A committer that died leaves its
   lease running until it expires: wait for it, or, only when it is known to be dead, pass
   ``force_live`` (``eo recover --force-live``; a live committer would be fenced).
1. The unfinished checkpoint, when PREPARED, is committed under that lease, in its commit
   mode (a spark-mode pipeline through the caller's Spark runner; locally, with a line saying
   so, where there is none or Spark cannot start):
   :func:`commit_checkpoint` fences each shard's transactional id (``init_transactions``
   aborts what the dead committer left open) and publishes only what the commit markers do
   not show yet — so nothing is published twice.
2. Every other transactional id this pipeline's commits ever used (the ledger's commit
   shards, plus the ids today's settings give) is fenced: an open transaction under one of
   them belongs to a zombie of an already finished checkpoint and is aborted; nothing in it
   was ever committed, so nothing is lost.
3. The sink partitions are read again; a transaction still open is not ours (another
   producer): reported with how to find its owner.

With ``abort_hanging`` (``eo recover --abort-hanging``), right after the lease is taken and
before step 1, the open transactions on the sink and the marker group's partition are listed
with Kafka's Java admin client and ours are ended (core/hanging.py): by fencing their
transactional id, or, for a hanging one no coordinator holds, by KIP-664's abort; foreign
ones are named and left alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.fencing import FENCE_LEASE_S, FenceLease, fence, fence_owner
from airflow_provider_eo.core.hanging import HangingResult
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.shard import KafkaClients, ShardRunner
from airflow_provider_eo.errors import RecoverError
from airflow_provider_eo.kafka.transactions import JavaAdmin
from airflow_provider_eo.ledger import Actor, CheckpointState, Ledger
from airflow_provider_eo.ledger.leases import FORCE_LIVE_HINT, CommitInProgress
from airflow_provider_eo.pipeline import Pipeline


@dataclass
class RecoverResult:
    """What ``eo recover`` found and did."""

    pipeline: str
    sink_topic: str
    open_before: dict[int, tuple[int, int]]  # partition -> (stable, high) where stable < high
    fenced: list[str] = field(default_factory=list)
    committed: int | None = None  # the PREPARED checkpoint this call committed
    published: int = 0
    open_after: dict[int, tuple[int, int]] = field(default_factory=dict)
    hanging: HangingResult | None = None  # with abort_hanging: what was listed and ended

    @property
    def clean(self) -> bool:
        """No transaction is left open on the sink."""
        return not self.open_after

    def summary(self) -> dict[str, Any]:
        """A JSON-ready view (``eo recover --json``)."""
        return {
            "pipeline": self.pipeline,
            "sink_topic": self.sink_topic,
            "open_before": {str(p): list(v) for p, v in sorted(self.open_before.items())},
            "fenced": self.fenced,
            "committed": self.committed,
            "published": self.published,
            "open_after": {str(p): list(v) for p, v in sorted(self.open_after.items())},
            "clean": self.clean,
            **({"hanging": self.hanging.summary()} if self.hanging is not None else {}),
        }


def recover_pipeline(
    pipeline: Pipeline,
    ledger: Ledger,
    *,
    actor: Actor | None = None,
    wait_s: float = 15.0,
    progress: Callable[[str], None] | None = None,
    clients: KafkaClients | None = None,
    force_live: bool = False,
    lease_ttl_s: float = FENCE_LEASE_S,
    abort_hanging: bool = False,
    admin: JavaAdmin | None = None,
    runner: ShardRunner | None = None,
) -> RecoverResult:
    """Fence the pipeline's transactional ids, commit its PREPARED checkpoint by the
    markers, and report what stays open on the sink (see the module docstring).

    Refuses (:class:`RecoverError`, nothing fenced) while a committer holds a live commit
    lease on a checkpoint of the pipeline. Safe to repeat: fencing only aborts what was never
    committed, and the commit publishes only what the markers lack.

    :param wait_s: how long to wait for the sink's last stable offsets to catch up after
        fencing (the broker writes the abort markers asynchronously).
    :param force_live: take the lease from a committer known to be dead while it runs.
    :param lease_ttl_s: how long each renewal of the fence lease lasts.
    :param abort_hanging: first list the open transactions with Kafka's Java admin client
        and end ours (see the module docstring); ``admin`` is the tool (default: this
        installation's).
    :param runner: where a spark-mode pipeline's shards run (spark/commit.py's
        ``SparkShardRunner``); without one, or where it cannot start Spark, the checkpoint is
        committed in this process and ``progress`` gets a line saying so (both modes keep the
        same markers and ledger rows).
    """
    clients = kafka_clients(pipeline.kafka, clients)
    say = progress or (lambda _line: None)
    where = f"pipeline {pipeline.name!r}: "
    unfinished = ledger.unfinished(pipeline.name)
    sink = unfinished.commit_plan.sink_topic if unfinished and unfinished.commit_plan else pipeline.sink_topic
    result = RecoverResult(pipeline.name, sink, clients.open_transactions(sink))
    for p, (stable, high) in result.open_before.items():
        say(f"open transaction on {sink}[{p}]: last stable offset {stable} < high watermark {high}")

    owner = fence_owner(actor)
    try:
        # 0. No committer of any checkpoint is live, and none begins until the end.
        with FenceLease(ledger, pipeline.name, owner=owner, ttl_s=lease_ttl_s, take_over=force_live) as lease:
            if abort_hanging:
                result.hanging = end_hanging_transactions(
                    pipeline, ledger, lease=lease, where=where, say=say, clients=clients, admin=admin
                )
            # 1. The PREPARED checkpoint: the commit fences its shards and publishes by the markers.
            done: set[str] = set()
            unfinished = ledger.unfinished(pipeline.name)
            if unfinished is not None and unfinished.state is CheckpointState.PREPARED:
                commit = commit_checkpoint(
                    pipeline,
                    ledger,
                    unfinished.checkpoint_id,
                    actor=actor,
                    owner=owner,
                    clients=clients,
                    runner=runner,
                    fallback=say,
                )
                result.committed, result.published = unfinished.checkpoint_id, commit.published
                plan = commit.checkpoint.commit_plan
                if plan is not None:
                    done = {names.plan_transactional_id(plan, pipeline.name, s) for s in range(plan.shards)}
                say(
                    f"checkpoint {unfinished.checkpoint_id}: committed ({commit.published} records "
                    f"published, {commit.shards_skipped} shards already done by their markers)"
                )

            # 2. Every other id of ours: a zombie's open transaction is aborted.
            today = names.commit_plan(pipeline, clients.partition_count(pipeline.sink_topic))
            ids = set(ledger.transactional_ids(pipeline.name)) | {
                names.plan_transactional_id(today, pipeline.name, s) for s in range(today.shards)
            }
            for txn_id in sorted(ids - done):
                fence(
                    pipeline,
                    [txn_id],
                    lease=lease,
                    where=where,
                    refused=RecoverError,
                    then="Retry `eo recover`.",
                    clients=clients,
                )
                result.fenced.append(txn_id)
                say(f"fenced {txn_id}")
    except CommitInProgress as held:
        until = held.until.isoformat() if held.until else "?"
        dead = "" if held.lost else f" {FORCE_LIVE_HINT}"
        raise RecoverError(
            f"{where}checkpoint {held.checkpoint_id} is being committed by {held.owner!r} until "
            f"{until}; wait, or stop it first. `eo recover` fences the pipeline's transactional "
            "ids (one per commit shard, shared by all its checkpoints), which would kill that "
            f"committer; it stopped before that (fenced so far: {result.fenced or 'nothing'}). "
            f"A committer that died holds its lease until then: retry after {until}.{dead}"
        ) from held

    # 3. What is still open is not ours.
    deadline = time.monotonic() + wait_s
    while True:
        result.open_after = clients.open_transactions(sink)
        if not result.open_after or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return result


def end_hanging_transactions(
    pipeline: Pipeline,
    ledger: Ledger,
    *,
    lease: FenceLease,
    where: str,
    say: Callable[[str], None],
    clients: KafkaClients | None = None,
    admin: JavaAdmin | None = None,
) -> HangingResult:
    """``--abort-hanging``: list the open transactions on the pipeline's partitions and end
    ours under ``lease`` (core/hanging.py); the ledger's shard rows say what each was.

    :raises RecoverError: the Java admin client cannot run here (nothing ended), or a hanging
        transaction is of a shard the ledger records COMMITTED (not aborted).
    """
    clients = kafka_clients(pipeline.kafka, clients)
    from airflow_provider_eo.core.hanging import default_admin, end_hanging, read_pipeline_transactions
    from airflow_provider_eo.errors import TransactionAdminUnavailable

    unfinished = ledger.unfinished(pipeline.name)
    try:
        tool = admin or default_admin()
        listed = read_pipeline_transactions(
            pipeline,
            plan=unfinished.commit_plan if unfinished is not None else None,
            known_ids=ledger.transactional_ids(pipeline.name),
            checkpoints=ledger.list_checkpoints(pipeline.name, limit=50),
            admin=tool,
        )
    except TransactionAdminUnavailable as exc:
        raise RecoverError(
            f"{where}--abort-hanging needs Kafka's Java admin client: {exc} Nothing was fenced "
            "or aborted; `eo recover` without --abort-hanging still fences every transactional "
            "id of this pipeline."
        ) from exc
    return end_hanging(
        pipeline,
        listed,
        fence_ids=lambda ids: fence(
            pipeline,
            ids,
            lease=lease,
            where=where,
            refused=RecoverError,
            then="Retry `eo recover`.",
            clients=clients,
        ),
        abort_marker=lambda producer: tool.abort(
            pipeline.kafka, producer, owner=f"pipeline {pipeline.name!r}"
        ),
        renew=lease.renew,
        say=say,
    )
