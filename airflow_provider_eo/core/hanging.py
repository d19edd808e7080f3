"""Open transactions on a pipeline's partitions: whose they are, and ending ours.

Kafka's Java admin client lists them (:mod:`airflow_provider_eo.kafka.transactions`) on the
partitions a commit of the pipeline writes: the sink's, and the ``__consumer_offsets``
partition of its marker group (a commit's pending marker, a transactional offset commit,
lives there). Each is attributed:

- **ours** by transactional id: ``{prefix}.{pipeline}.<shard>`` or any id the ledger's
  commit shards recorded; or, when no coordinator holds it (a hanging transaction, its
  transactional id unknown), by its records: the first record it holds open on a sink
  partition carries this pipeline's ``eo.prov`` header (which also names the checkpoint);
- **foreign** otherwise: never touched, reported with its transactional id.

``eo recover --abort-hanging`` ends ours under the recovery's fence lease (no committer is
live), after the ledger said what each was:

1. a transaction whose transactional id is known is ended by fencing that id
   (``init_transactions``: the coordinator aborts it, or completes one it already decided to
   commit), never by marker;
2. a hanging one (no coordinator holds it, so no fence reaches it) is aborted with KIP-664's
   abortTransaction on each partition it holds open, unless the ledger records the shard its
   records belong to as COMMITTED: then it may be the committed transaction whose commit
   marker never reached that partition, and an abort marker would drop committed records
   (refused, nothing aborted for it);
3. the checkpoint it belonged to is then finished by recover's normal path (a PREPARED one
   is committed by its markers: only what they lack is published).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.errors import EoError, RecoverError, TransactionAdminUnavailable
from airflow_provider_eo.kafka.transactions import (
    JavaAdmin,
    OpenTransaction,
    Partition,
    TransactionView,
    first_record_source,
)
from airflow_provider_eo.ledger import CheckpointRecord, CommitPlan
from airflow_provider_eo.ledger.records import ShardRecord
from airflow_provider_eo.pipeline import Pipeline

OFFSETS_TOPIC = "__consumer_offsets"
#: The checkpoints whose shard rows say what an open transaction of ours was.
RECENT_CHECKPOINTS = 50


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, as a signed 32-bit int)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def group_partition(group: str, offsets_partitions: int) -> int:
    """The ``__consumer_offsets`` partition holding ``group``'s offsets (Kafka's
    ``Utils.abs(group.hashCode()) % partitions``)."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % offsets_partitions


def transactional_namespace(plan_or_prefix: CommitPlan | str, pipeline: str) -> str:
    """``{prefix}.{pipeline}.``: what every commit shard's transactional id starts with."""
    prefix = plan_or_prefix if isinstance(plan_or_prefix, str) else plan_or_prefix.transactional_id_prefix
    return f"{prefix}.{pipeline}."


def is_ours_by_id(transactional_id: str, *, namespaces: Iterable[str], known_ids: Iterable[str]) -> bool:
    """A commit shard's id of this pipeline: recorded in the ledger, or
    ``{prefix}.{pipeline}.<shard number>``."""
    if transactional_id in set(known_ids):
        return True
    for ns in namespaces:
        rest = transactional_id[len(ns) :] if transactional_id.startswith(ns) else ""
        if rest.isdigit():
            return True
    return False


@dataclass(frozen=True)
class ShardOrigin:
    """The ledger's shard row a transaction was written for."""

    checkpoint_id: int
    checkpoint_state: str
    shard: int
    shard_state: str

    def describe(self) -> str:
        """``checkpoint N (STATE) shard s (STATE)``."""
        return (
            f"checkpoint {self.checkpoint_id} ({self.checkpoint_state}) "
            f"shard {self.shard} ({self.shard_state})"
        )


@dataclass(frozen=True)
class Attributed:
    """One open transaction and whose it is."""

    txn: OpenTransaction
    ours: bool
    origin: ShardOrigin | None = None

    def describe(self, now_ms: int) -> str:
        """``ours: ...`` / ``foreign: ...`` with the ledger's shard when known."""
        who = "ours" if self.ours else "foreign"
        hanging = " (hanging: no coordinator holds it)" if not self.txn.known else ""
        of = f" ({self.origin.describe()})" if self.origin is not None else ""
        return f"{who}: {self.txn.describe(now_ms)}{hanging}{of}"


def _row(cp: CheckpointRecord, shard: ShardRecord) -> ShardOrigin:
    return ShardOrigin(cp.checkpoint_id, cp.state.value, shard.shard, shard.state.value)


def _origin_by_id(transactional_id: str, checkpoints: Sequence[CheckpointRecord]) -> ShardOrigin | None:
    """The newest shard row of ``transactional_id``."""
    for cp in sorted(checkpoints, key=lambda c: c.checkpoint_id, reverse=True):
        for sh in cp.shards:
            if sh.transactional_id == transactional_id:
                return _row(cp, sh)
    return None


def _origin_by_records(
    txn: OpenTransaction,
    pipeline: str,
    first_records: Mapping[tuple[str, int, int], tuple[str, int] | None],
    checkpoints: Sequence[CheckpointRecord],
) -> ShardOrigin | None:
    """The shard row of the checkpoint whose records (``eo.prov``: this pipeline's name)
    open ``txn`` on one of its partitions; None when none of them is this pipeline's."""
    by_id = {cp.checkpoint_id: cp for cp in checkpoints}
    for p in txn.producers:
        source = first_records.get((p.topic, p.partition, p.start_offset))
        if source is None or source[0] != pipeline:
            continue
        cp = by_id.get(source[1])
        plan = cp.commit_plan if cp is not None else None
        if cp is None or plan is None or p.partition >= len(plan.shard_of_partition):
            return ShardOrigin(source[1], "?", -1, "?")
        shard = plan.shard_of_partition[p.partition]
        row = next((sh for sh in cp.shards if sh.shard == shard), None)
        return ShardOrigin(cp.checkpoint_id, cp.state.value, shard, row.state.value if row else "no row")
    return None


def attribute(
    transactions: Iterable[OpenTransaction],
    *,
    pipeline: str,
    namespaces: Iterable[str],
    known_ids: Iterable[str],
    checkpoints: Sequence[CheckpointRecord],
    first_records: Mapping[tuple[str, int, int], tuple[str, int] | None] | None = None,
) -> tuple[Attributed, ...]:
    """Each transaction as ours or foreign (see the module docstring). ``first_records``:
    the (pipeline, checkpoint) that the ``eo.prov`` header of the first record of a hanging
    transaction names, per (topic, partition, offset).

    A foreign transaction that touches only ``__consumer_offsets`` is left out: that
    partition holds many groups' offsets, and another group's pending offsets hold back
    neither the sink nor our markers."""
    namespaces, known_ids = tuple(namespaces), tuple(known_ids)
    out = []
    for txn in transactions:
        if txn.transactional_id is not None:
            ours = is_ours_by_id(txn.transactional_id, namespaces=namespaces, known_ids=known_ids)
            origin = _origin_by_id(txn.transactional_id, checkpoints) if ours else None
        else:
            origin = _origin_by_records(txn, pipeline, first_records or {}, checkpoints)
            ours = origin is not None
        if not ours and all(t == OFFSETS_TOPIC for t, _p in txn.partitions):
            continue
        out.append(Attributed(txn, ours, origin))
    return tuple(out)


@dataclass(frozen=True)
class PipelineTransactions:
    """The open transactions on a pipeline's partitions, attributed."""

    partitions: tuple[Partition, ...]
    transactions: tuple[Attributed, ...]
    errors: tuple[str, ...]
    now_ms: int

    @property
    def ours(self) -> tuple[Attributed, ...]:
        """This pipeline's."""
        return tuple(a for a in self.transactions if a.ours)

    @property
    def foreign(self) -> tuple[Attributed, ...]:
        """Other producers'."""
        return tuple(a for a in self.transactions if not a.ours)


def default_admin(timeout_s: float = 30.0) -> JavaAdmin:
    """The Java admin tool of this installation.

    :raises TransactionAdminUnavailable: no Java runtime, no kafka-clients jar, or the tool
        is not built and cannot be here (the message names which and the fix).
    """
    from airflow_provider_eo.stack.kafka_admin import admin_classpath, java_binary

    try:
        return JavaAdmin(java_binary(), tuple(admin_classpath()), timeout_s)
    except EoError as exc:  # StackError: what is missing, and the command that provides it
        raise TransactionAdminUnavailable(f"Kafka's transaction admin calls cannot run here: {exc}") from exc


def watched_partitions(config: Mapping[str, Any], sinks: Iterable[str], marker_group: str) -> list[Partition]:
    """Every partition of ``sinks`` and the marker group's ``__consumer_offsets`` partition
    (omitted when the topic's metadata is hidden, e.g. by ACLs)."""
    from airflow_provider_eo.kafka import admin

    md = admin.admin_client(config).list_topics(timeout=15)
    out: list[Partition] = []
    for sink in dict.fromkeys(sinks):
        meta = md.topics.get(sink)
        if meta is not None and meta.error is None:
            out.extend((sink, p) for p in sorted(meta.partitions))
    offsets = md.topics.get(OFFSETS_TOPIC)
    if offsets is not None and offsets.error is None and offsets.partitions:
        out.append((OFFSETS_TOPIC, group_partition(marker_group, len(offsets.partitions))))
    return out


def read_pipeline_transactions(
    pipeline: Pipeline,
    *,
    plan: CommitPlan | None,
    known_ids: Iterable[str],
    checkpoints: Sequence[CheckpointRecord],
    admin: JavaAdmin | None = None,
    now_ms: int | None = None,
) -> PipelineTransactions:
    """The open transactions on ``pipeline``'s sink(s) and its marker group's partition,
    attributed (``plan``: the unfinished checkpoint's frozen plan, whose sink, prefix and
    marker group may differ from today's settings).

    :raises TransactionAdminUnavailable: the Java admin client cannot run here or the
        coordinators did not answer.
    """
    from airflow_provider_eo.kafka.client_config import librdkafka_config

    config = librdkafka_config(pipeline.kafka)
    sinks = [pipeline.sink_topic] + ([plan.sink_topic] if plan is not None else [])
    group = plan.marker_group if plan is not None else names.marker_group(pipeline)
    partitions = watched_partitions(config, sinks, group)
    tool = admin or default_admin()
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    view: TransactionView = tool.list_open(
        pipeline.kafka, partitions, owner=f"pipeline {pipeline.name!r}", now_ms=now
    )
    namespaces = [transactional_namespace(pipeline.transactional_id_prefix, pipeline.name)]
    if plan is not None:
        namespaces.append(transactional_namespace(plan, pipeline.name))
    first_records = {
        (p.topic, p.partition, p.start_offset): first_record_source(
            config, p.topic, p.partition, p.start_offset
        )
        for t in view.transactions
        if not t.known
        for p in t.producers
        if p.topic != OFFSETS_TOPIC
    }
    attributed = attribute(
        view.transactions,
        pipeline=pipeline.name,
        namespaces=namespaces,
        known_ids=known_ids,
        checkpoints=checkpoints,
        first_records=first_records,
    )
    return PipelineTransactions(tuple(partitions), attributed, view.errors, now)


@dataclass
class HangingResult:
    """What ``--abort-hanging`` found and did."""

    found: list[str] = field(default_factory=list)  # every open transaction, described
    fenced: list[str] = field(default_factory=list)  # our transactional ids fenced
    aborted: list[str] = field(default_factory=list)  # hanging ones aborted by marker
    foreign: list[str] = field(default_factory=list)  # left alone

    def summary(self) -> dict[str, list[str]]:
        """A JSON-ready view."""
        return {"found": self.found, "fenced": self.fenced, "aborted": self.aborted, "foreign": self.foreign}


def end_hanging(
    pipeline: Pipeline,
    listed: PipelineTransactions,
    *,
    fence_ids: Callable[[list[str]], None],
    abort_marker: Callable[[Any], None],
    renew: Callable[[], None],
    say: Callable[[str], None],
) -> HangingResult:
    """End our open transactions of ``listed`` (steps 1 and 2 of the module docstring);
    foreign ones are reported only. The caller holds the fence lease (``renew`` renews it
    before each abort by marker; ``fence_ids`` renews it itself).

    :raises RecoverError: a hanging transaction is of a shard the ledger records COMMITTED
        (nothing aborted by marker for it; the others are ended).
    """
    where = f"pipeline {pipeline.name!r}: "
    result = HangingResult()
    refused: list[str] = []
    for a in listed.transactions:
        line = a.describe(listed.now_ms)
        result.found.append(line)
        say(f"open transaction: {line}")
        if not a.ours:
            result.foreign.append(line)
            continue
        txn = a.txn
        if txn.transactional_id is not None:
            fence_ids([txn.transactional_id])
            result.fenced.append(txn.transactional_id)
            say(f"fenced {txn.transactional_id} (its open transaction is aborted by the coordinator)")
            continue
        if a.origin is not None and a.origin.shard_state == "COMMITTED":
            refused.append(line)
            continue
        for producer in txn.producers:
            renew()
            abort_marker(producer)
            done = (
                f"producer {producer.producer_id}/{producer.producer_epoch} "
                f"on {producer.topic}[{producer.partition}]"
            )
            result.aborted.append(done)
            say(f"aborted the hanging transaction of {done} (KIP-664)")
    if refused:
        raise RecoverError(
            f"{where}hanging transaction(s) of shards the ledger records COMMITTED: "
            f"{'; '.join(refused)}. Each is a committed transaction whose commit marker never "
            "reached that partition: an abort marker would drop committed records, so none was "
            "written for it. Its records stay invisible to read_committed consumers until the "
            "broker completes it; ask the Kafka operators to check the transaction coordinator "
            f"(ended meanwhile: fenced {result.fenced or 'nothing'}, "
            f"aborted {result.aborted or 'nothing'})."
        )
    return result


__all__ = [
    "OFFSETS_TOPIC",
    "Attributed",
    "HangingResult",
    "PipelineTransactions",
    "ShardOrigin",
    "attribute",
    "default_admin",
    "end_hanging",
    "group_partition",
    "is_ours_by_id",
    "java_string_hash",
    "read_pipeline_transactions",
    "transactional_namespace",
    "watched_partitions",
]
