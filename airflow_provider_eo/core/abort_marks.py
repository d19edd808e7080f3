"""Abort marks: an abort's word, kept by Kafka, that no commit task may publish a checkpoint.

A spark-mode commit runs each shard's transaction in a Spark task on an executor, which
never reaches the ledger: the driver takes the commit lease once for all of them. A task
that Spark starts late (queued behind others on few cores, a retry of a lost executor's
task, a speculative copy) may begin after the lease lapsed and an abort took the checkpoint
over. Its ``init_transactions`` comes after the abort's fence, so the fence cannot stop it,
and the abort read no marker: without more, that task would publish a checkpoint whose
range is replanned (every record twice). So:

1. The abort, after fencing every shard and finding none published, commits one Kafka
   transaction per shard's transactional id (a fresh producer, ``init_transactions``, the
   marker read again, then a transactional offset commit into the consumer group
   ``eo-aborted.<pipeline>`` on the shard's marker partition, whose metadata lists the
   aborted checkpoint ids). Only then does it mark the checkpoint ABORTED.
2. A commit task reads its shard's abort mark after its own ``init_transactions``, right
   before ``begin_transaction`` (a stable read: pending transactional offset commits are
   waited out), and refuses a listed checkpoint (:class:`CheckpointAborted`).

Why that closes it, by where the task's ``init_transactions`` falls for the shard:

- before the abort's init of step 1: that init fences the task; it commits nothing after
  it, and the marker the abort reads after its init shows whatever the task committed
  before (then the abort is refused: published).
- between the abort's init and its commit: the task's init fences the abort's producer,
  whose commit fails; the abort redoes the shard (its new init fences the task in turn).
- after the abort's commit: the task's stable read shows the mark and it refuses.

A mark lists only ids above the shard's marker (a later commit of the shard has moved past
them); it expires with the group's offsets (``offsets.retention.minutes``, 7 days by
default), far longer than a Spark task is delayed. A local commit needs no mark: it takes
the ledger's lease after its own ``init_transactions`` (core/commit.py), and the ledger
refuses an ABORTED checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from airflow_provider_eo import names
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.markers import decide_marker
from airflow_provider_eo.core.shard import KafkaClients, ShardCommittable
from airflow_provider_eo.errors import AbortRefused, CheckpointAborted, CommitFenced
from airflow_provider_eo.kafka.publisher import Abortable, ProducerLost, connect, kafka_call, offsets

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import CheckpointRecord
    from airflow_provider_eo.pipeline import Pipeline

#: Rounds of one shard's mark before the abort gives up (each lost round means a late task
#: of the shard ran ``init_transactions`` meanwhile; the next round fences it).
MAX_MARK_ROUNDS = 5

#: Longest id list a mark keeps (the broker's ``offset.metadata.max.bytes`` is 4096 by
#: default); the lowest ids go first: they are the oldest aborts.
MAX_MARK_CHARS = 3000


def format_ids(ids: Iterable[int]) -> str:
    """Checkpoint ids as ascending ranges: ``{4, 7, 8, 9}`` -> ``"4,7-9"``."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_ids(text: str) -> set[int]:
    """The inverse of :func:`format_ids` (an unreadable part is skipped)."""
    out: set[int] = set()
    for part in text.split(","):
        first, _sep, last = part.partition("-")
        try:
            out.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return out


def _bounded(ids: set[int]) -> str:
    text = format_ids(ids)
    ordered = sorted(ids)
    while len(text) > MAX_MARK_CHARS and ordered:
        ordered.pop(0)
        text = format_ids(ordered)
    return text


def aborted_checkpoints(
    clients: KafkaClients,
    *,
    pipeline: str,
    identity: str,
    sink_topic: str,
    shard: int,
) -> set[int]:
    """The checkpoint ids the shard's abort mark lists (a stable read); a mark of another
    ledger's identity lists none for this one."""
    found = clients.committed_marks(names.aborted_group(pipeline), [(sink_topic, shard)])
    mark = found.get((sink_topic, shard))
    parsed = names.parse_abort_mark(mark[1] if mark is not None else None)
    if parsed is None or parsed[0] != identity:
        return set()
    return parse_ids(parsed[1])


def refuse_if_aborted(c: ShardCommittable, clients: KafkaClients) -> None:
    """Raise :class:`CheckpointAborted` when the shard's abort mark lists ``c``'s checkpoint.
    Call after the shard's ``init_transactions`` and before ``begin_transaction``."""
    aborted = aborted_checkpoints(
        clients, pipeline=c.pipeline, identity=c.identity, sink_topic=c.sink_topic, shard=c.shard
    )
    if c.checkpoint_id in aborted:
        raise CheckpointAborted(
            f"{c.where}an abort of this checkpoint fenced transactional id "
            f"{c.transactional_id!r} and marked it aborted (consumer group "
            f"{names.aborted_group(c.pipeline)!r}) before this commit task began its transaction: "
            "the task published nothing (the abort's range is replanned, so publishing it here "
            "would duplicate it). If the ledger still shows the checkpoint PREPARED, the abort "
            f"did not finish: run `eo abort MODULE:ATTR {c.checkpoint_id} --reason TEXT` again; "
            "should that be refused because a shard was published, finish the checkpoint with "
            "`eo commit --commit-mode local` (it takes the ledger's lease after fencing, so "
            "it needs no mark)."
        )


def mark_aborted(
    pipeline: Pipeline,
    identity: str,
    cp: CheckpointRecord,
    transactional_ids: list[str],
    *,
    renew: Callable[[], object],
    where: str,
    clients: KafkaClients | None = None,
) -> None:
    """Step 1 of the module docstring for every shard of ``cp`` (``transactional_ids[s]`` is
    shard ``s``'s), renewing the abort's lease (``renew``) before each.

    Raises :class:`AbortRefused` when a shard's marker shows ``cp`` after the mark's own
    fence (a late task published it first: the checkpoint cannot be aborted; the marks this
    call left on the shards before it are taken back, so a retried commit finishes them), or
    when a shard could not be marked (nothing was aborted; retry). Idempotent: marking a
    marked shard again changes nothing.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    marked: list[int] = []
    for shard, txn_id in enumerate(transactional_ids):
        try:
            _write_mark(
                pipeline, identity, cp, shard, txn_id, add=True, renew=renew, where=where, clients=clients
            )
        except AbortRefused:
            for done in marked:
                tid = transactional_ids[done]
                _write_mark(
                    pipeline, identity, cp, done, tid, add=False, renew=renew, where=where, clients=clients
                )
            raise
        marked.append(shard)


def _write_mark(
    pipeline: Pipeline,
    identity: str,
    cp: CheckpointRecord,
    shard: int,
    txn_id: str,
    *,
    add: bool,
    renew: Callable[[], object],
    where: str,
    clients: KafkaClients,
) -> None:
    """One shard's mark transaction: ``cp`` added to (``add``) or taken from its abort mark,
    in rounds until one commits (see the module docstring)."""
    plan = cp.commit_plan
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    sink = plan.sink_topic if plan is not None else pipeline.sink_topic
    timeout_s = pipeline.transaction_timeout_ms / 1000
    last: BaseException | None = None
    for _round in range(MAX_MARK_ROUNDS):
        renew()
        producer = clients.producer(txn_id, pipeline.transaction_timeout_ms, None, None)
        try:
            kafka_call("metadata", connect, producer, sink, timeout_s, where=where)
            kafka_call("init_transactions", producer.init_transactions, timeout_s, where=where)
            # No earlier producer of the id can commit now: the marker is final.
            found = clients.committed_marks(group, [(sink, shard)])
            done = decide_marker(
                pipeline.name, group, sink, shard, found.get((sink, shard)), identity=identity
            )
            if add and done >= cp.checkpoint_id:
                raise AbortRefused(
                    f"{where}shard {shard} was published (its commit marker shows checkpoint "
                    f"{done}) by a commit task that ran while this abort fenced it, so the "
                    "checkpoint cannot be aborted. Nothing was aborted; retry the commit to "
                    "finish the other shards (their markers prevent duplicates)."
                )
            ids = aborted_checkpoints(
                clients, pipeline=pipeline.name, identity=identity, sink_topic=sink, shard=shard
            )
            ids = {i for i in (ids | {cp.checkpoint_id} if add else ids - {cp.checkpoint_id}) if i > done}
            kafka_call("begin_transaction", producer.begin_transaction, where=where)
            kafka_call(
                "send_offsets_to_transaction(abort mark)",
                producer.send_offsets_to_transaction,
                offsets(
                    {(sink, shard): max(ids, default=0)}, names.abort_mark_metadata(identity, _bounded(ids))
                ),
                clients.group_metadata(names.aborted_group(pipeline.name)),
                timeout_s,
                where=where,
            )
            kafka_call(
                "commit_transaction",
                producer.commit_transaction,
                timeout_s,
                deadline_s=2 * timeout_s,
                where=where,
            )
            return
        except (CommitFenced, ProducerLost, Abortable) as exc:
            # Another producer of the id (a late commit task) ran init_transactions since
            # ours, or the broker did not answer: the next round's init fences it again.
            last = exc
        finally:
            del producer
    raise AbortRefused(
        f"{where}could not {'leave' if add else 'take back'} the abort mark of shard {shard} "
        f"(transactional id {txn_id!r}) after {MAX_MARK_ROUNDS} rounds (last: {last}). Nothing was "
        "aborted and the checkpoint is unchanged; retry the abort once the broker answers."
    )


__all__ = ["aborted_checkpoints", "format_ids", "mark_aborted", "parse_ids", "refuse_if_aborted"]
