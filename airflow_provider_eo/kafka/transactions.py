"""Open Kafka transactions, read and aborted with the Java admin client.

librdkafka (confluent-kafka) has no ListTransactions, DescribeTransactions, DescribeProducers
or KIP-664's abortTransaction; Kafka's Java ``Admin`` has all four. :class:`JavaAdmin` runs
them in a short-lived JVM (``eo.kafka.Transactions``, one small class compiled by
:mod:`airflow_provider_eo.stack.kafka_admin`), so no Spark session is needed:

- the pipeline's Kafka settings are translated for the Java client as for Spark's reader
  (:func:`~airflow_provider_eo.kafka.client_config.java_client_options`: SASL/SSL included)
  and handed over in a properties file only this user can read (0600), removed after the
  call: never on a command line, never logged;
- every call is bounded: the client's own API timeout, and the JVM is killed past it;
- the JVM prints one JSON object per line; :func:`parse_tool_output` reads them and
  :func:`join_open_transactions` joins the coordinators' view (transactional id, producer
  id/epoch, state, start time, partitions) with the partition leaders' (every producer with
  an open transaction there, a hanging one its coordinator no longer knows included).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_eo.errors import TransactionAdminUnavailable
from airflow_provider_eo.kafka.client_config import java_client_options

TRANSACTIONS_CLASS = "eo.kafka.Transactions"
#: Coordinator states in which a transaction is decided committed: its commit markers are
#: being written. Never aborted by marker (that would drop committed records).
COMMITTING_STATES = frozenset({"PREPARE_COMMIT", "COMPLETE_COMMIT"})

Partition = tuple[str, int]
#: How long the JVM may run past the client's own API timeout (its start, the admin client's
#: close) before it is killed.
_GRACE_S = 15.0


@dataclass(frozen=True)
class CoordinatorTransaction:
    """An open transaction as its coordinator describes it (DescribeTransactions)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_id: int
    state: str  # ONGOING, PREPARE_COMMIT, PREPARE_ABORT, PREPARE_EPOCH_FENCE
    start_ms: int | None  # when its first partition was added
    timeout_ms: int
    partitions: tuple[Partition, ...]


@dataclass(frozen=True)
class PartitionProducer:
    """A producer with an open transaction on one partition, as the partition's leader
    describes it (DescribeProducers): what KIP-664's abort needs."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int | None  # None: no marker written for this producer yet
    start_offset: int  # the open transaction's first offset on this partition
    last_timestamp_ms: int


@dataclass(frozen=True)
class OpenTransaction:
    """One producer's open transaction on the partitions asked about.

    ``transactional_id`` is None when no coordinator holds an open transaction of this
    producer: a hanging transaction (the coordinator finished or forgot it, the partition
    never got its marker); only KIP-664's abort by producer id ends it.
    """

    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    state: str | None
    start_ms: int | None
    timeout_ms: int | None
    partitions: tuple[Partition, ...]
    producers: tuple[PartitionProducer, ...] = ()

    @property
    def known(self) -> bool:
        """The coordinator holds it (it can be ended by fencing its transactional id)."""
        return self.transactional_id is not None

    def age_s(self, now_ms: int) -> float | None:
        """Seconds since it began (its coordinator's start time); None when no coordinator
        holds it."""
        if self.start_ms is None:  # the leaders know record timestamps only, not the start
            return None
        return max(0.0, (now_ms - self.start_ms) / 1000)

    def hanging(self, now_ms: int) -> bool:
        """Unknown to its coordinator, or open longer than its timeout (the coordinator
        should have aborted it)."""
        if not self.known:
            return True
        age = self.age_s(now_ms)
        return age is not None and self.timeout_ms is not None and age * 1000 > self.timeout_ms

    def describe(self, now_ms: int) -> str:
        """One line: id, producer, state, partitions and age."""
        age = self.age_s(now_ms)
        who = (
            repr(self.transactional_id)
            if self.known
            else "transactional id unknown (no coordinator holds it)"
        )
        parts = ", ".join(f"{t}[{p}]" for t, p in self.partitions)
        return (
            f"{who}, producer {self.producer_id}/{self.producer_epoch}"
            + (f", {self.state}" if self.state else "")
            + f" on {parts}"
            + (f", open for {age:.0f}s" if age is not None else ", age unknown")
        )


@dataclass(frozen=True)
class ToolOutput:
    """What one run of the tool printed, parsed."""

    transactions: tuple[CoordinatorTransaction, ...] = ()
    producers: tuple[PartitionProducer, ...] = ()
    errors: tuple[str, ...] = ()
    aborted: tuple[Partition, ...] = ()


@dataclass(frozen=True)
class TransactionView:
    """Open transactions touching the partitions asked about, and what could not be read."""

    transactions: tuple[OpenTransaction, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)
    now_ms: int = 0


def parse_tool_output(text: str) -> ToolOutput:
    """The tool's JSON lines (see the Java class) as typed records; a line that is not a
    JSON object (a JVM warning) is ignored."""
    txns: list[CoordinatorTransaction] = []
    producers: list[PartitionProducer] = []
    errors: list[str] = []
    aborted: list[Partition] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = row.get("kind")
        if kind == "transaction":
            start = int(row["start_ms"])
            txns.append(
                CoordinatorTransaction(
                    transactional_id=str(row["transactional_id"]),
                    producer_id=int(row["producer_id"]),
                    producer_epoch=int(row["producer_epoch"]),
                    coordinator_id=int(row["coordinator_id"]),
                    state=str(row["state"]),
                    start_ms=start if start >= 0 else None,
                    timeout_ms=int(row["timeout_ms"]),
                    partitions=tuple(sorted((str(t), int(p)) for t, p in row["partitions"])),
                )
            )
        elif kind == "producer":
            epoch = int(row["coordinator_epoch"])
            producers.append(
                PartitionProducer(
                    topic=str(row["topic"]),
                    partition=int(row["partition"]),
                    producer_id=int(row["producer_id"]),
                    producer_epoch=int(row["producer_epoch"]),
                    coordinator_epoch=epoch if epoch >= 0 else None,
                    start_offset=int(row["start_offset"]),
                    last_timestamp_ms=int(row["last_timestamp"]),
                )
            )
        elif kind == "error":
            errors.append(f"{row.get('call')}: {row.get('type')}: {row.get('message')}")
        elif kind == "aborted":
            aborted.append((str(row["topic"]), int(row["partition"])))
    return ToolOutput(tuple(txns), tuple(producers), tuple(errors), tuple(aborted))


def join_open_transactions(
    output: ToolOutput, partitions: Iterable[Partition], *, now_ms: int
) -> TransactionView:
    """The open transactions touching ``partitions``: each coordinator transaction that
    includes one of them, with the leaders' view of it, plus each producer the leaders show
    open there that no coordinator transaction explains (hanging), one per producer id."""
    wanted = set(partitions)
    by_pid: dict[int, list[PartitionProducer]] = {}
    for p in output.producers:
        if (p.topic, p.partition) in wanted:
            by_pid.setdefault(p.producer_id, []).append(p)
    out: list[OpenTransaction] = []
    seen: set[int] = set()
    for t in sorted(output.transactions, key=lambda t: t.transactional_id):
        leaders = by_pid.get(t.producer_id, [])
        touched = sorted({q for q in t.partitions if q in wanted} | {(p.topic, p.partition) for p in leaders})
        if not touched:
            continue
        seen.add(t.producer_id)
        out.append(
            OpenTransaction(
                t.producer_id,
                t.producer_epoch,
                t.transactional_id,
                t.state,
                t.start_ms,
                t.timeout_ms,
                tuple(touched),
                tuple(leaders),
            )
        )
    for pid in sorted(set(by_pid) - seen):
        leaders = by_pid[pid]
        out.append(
            OpenTransaction(
                pid,
                max(p.producer_epoch for p in leaders),
                None,
                None,
                None,
                None,
                tuple(sorted({(p.topic, p.partition) for p in leaders})),
                tuple(leaders),
            )
        )
    return TransactionView(tuple(out), output.errors, now_ms)


def first_record_source(
    config: Mapping[str, Any], topic: str, partition: int, offset: int, *, timeout_s: float = 10.0
) -> tuple[str, int] | None:
    """(pipeline, checkpoint) named by the ``eo.prov`` header of the record at ``offset`` of
    ``topic[partition]`` (read uncommitted: the first record of an open transaction), None
    when it carries none or cannot be read within ``timeout_s``."""
    import time
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from airflow_provider_eo import names
    from airflow_provider_eo.kafka.client_config import librdkafka_config

    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-txn-{uuid.uuid4().hex[:8]}",  # never joined: assign() only
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",  # an open transaction's records
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            for header in msg.headers() or []:
                key, value = header[0], header[1]
                if key == names.HEADER_PROVENANCE and isinstance(value, bytes):
                    parsed = names.parse_provenance(value)
                    if parsed is None:
                        return None
                    # pipeline:checkpoint, or pipeline:checkpoint:identity
                    fields = parsed[0].decode(errors="replace").split(":")
                    return (fields[0], int(fields[1])) if len(fields) >= 2 and fields[1].isdigit() else None
            return None
        return None
    finally:
        consumer.close()


def java_admin_properties(config: Mapping[str, Any], *, owner: str) -> dict[str, str]:
    """The Java admin client's properties from a pipeline's librdkafka-style ``config`` (the
    same translation Spark's reader gets; ``java.<setting>`` keys win)."""
    return {k[len("kafka.") :]: v for k, v in java_client_options(config, owner=owner).items()}


def _properties_text(props: Mapping[str, str]) -> str:
    """``java.util.Properties`` text (every key and value escaped)."""

    def esc(s: str, key: bool) -> str:
        out = []
        for i, c in enumerate(s):
            if c in "\\":
                out.append("\\\\")
            elif c == "\n":
                out.append("\\n")
            elif c == "\r":
                out.append("\\r")
            elif c == "\t":
                out.append("\\t")
            elif c in "=:#!" or (c == " " and (key or i == 0)):
                out.append("\\" + c)
            elif ord(c) > 0x7E:  # read as ISO-8859-1: escaped as UTF-16 units
                units = c.encode("utf-16-be")
                out.extend(
                    f"\\u{int.from_bytes(units[j : j + 2], 'big'):04x}" for j in range(0, len(units), 2)
                )
            else:
                out.append(c)
        return "".join(out)

    return "".join(f"{esc(k, True)}={esc(v, False)}\n" for k, v in sorted(props.items()))


@dataclass(frozen=True)
class JavaAdmin:
    """Runs ``eo.kafka.Transactions`` with ``classpath`` on ``java``; each call a new JVM,
    bounded by ``timeout_s`` (the client's API timeout, the JVM killed a few seconds after)."""

    java: str
    classpath: tuple[Path, ...]
    timeout_s: float = 30.0

    def list_open(
        self, config: Mapping[str, Any], partitions: Sequence[Partition], *, owner: str, now_ms: int
    ) -> TransactionView:
        """Every open transaction touching ``partitions`` (see :func:`join_open_transactions`).

        :raises TransactionAdminUnavailable: the JVM did not run or timed out, or the
            coordinators did not answer (a leader that did not answer for its partition is
            in :attr:`TransactionView.errors`).
        """
        out = self._run(config, ["list", *(f"{t}:{p}" for t, p in partitions)], owner=owner)
        listing_failed = [e for e in out.errors if not e.startswith(("producers ", "describe "))]
        if listing_failed:
            raise TransactionAdminUnavailable(
                f"{owner}: Kafka did not list its open transactions: {'; '.join(listing_failed)}. "
                "The call needs DescribeTransactionalId (list/describe) and Read on the topics "
                "(producers) in the broker's ACLs."
            )
        return join_open_transactions(out, partitions, now_ms=now_ms)

    def abort(self, config: Mapping[str, Any], producer: PartitionProducer, *, owner: str) -> None:
        """Write an abort marker for ``producer``'s open transaction on its partition
        (KIP-664): the partition's last stable offset moves past it.

        :raises TransactionAdminUnavailable: the broker refused or did not answer.
        """
        out = self._run(
            config,
            [
                "abort",
                f"{producer.topic}:{producer.partition}",
                str(producer.producer_id),
                str(producer.producer_epoch),
                # Kafka's own kafka-transactions.sh uses 0 when no marker was written yet.
                str(producer.coordinator_epoch or 0),
            ],
            owner=owner,
        )
        if (producer.topic, producer.partition) not in out.aborted:
            raise TransactionAdminUnavailable(
                f"{owner}: the open transaction of producer {producer.producer_id} on "
                f"{producer.topic}[{producer.partition}] was not aborted: "
                f"{'; '.join(out.errors) or 'no answer'}"
            )

    def _run(self, config: Mapping[str, Any], args: list[str], *, owner: str) -> ToolOutput:
        props = java_admin_properties(config, owner=owner)
        timeout_ms = max(1000, int(self.timeout_s * 1000))
        fd, path = tempfile.mkstemp(prefix="eo-admin-", suffix=".properties")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(_properties_text(props))
            cmd = [
                self.java,
                "-XX:TieredStopAtLevel=1",  # a short run: the JIT's first tier starts fastest
                "-XX:+UseSerialGC",
                "-Xmx128m",
                "-cp",
                os.pathsep.join(str(p) for p in self.classpath),
                TRANSACTIONS_CLASS,
                path,
                str(timeout_ms),
                *args,
            ]
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=self.timeout_s + _GRACE_S, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise TransactionAdminUnavailable(
                    f"{owner}: Kafka's transaction admin call ({args[0]}) did not finish within "
                    f"{self.timeout_s + _GRACE_S:.0f}s (the JVM was stopped); check that the brokers "
                    "are reachable and retry"
                ) from exc
            except OSError as exc:
                raise TransactionAdminUnavailable(f"{owner}: could not start {self.java}: {exc}") from exc
        finally:
            os.unlink(path)
        out = parse_tool_output(proc.stdout)
        if proc.returncode not in (0, 1) or (proc.returncode == 1 and not out.errors):
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise TransactionAdminUnavailable(
                f"{owner}: Kafka's transaction admin tool failed (exit {proc.returncode}): "
                f"{'; '.join(out.errors) or tail or 'no output'}"
            )
        return out


__all__ = [
    "COMMITTING_STATES",
    "CoordinatorTransaction",
    "JavaAdmin",
    "OpenTransaction",
    "PartitionProducer",
    "ToolOutput",
    "TransactionView",
    "first_record_source",
    "java_admin_properties",
    "join_open_transactions",
    "parse_tool_output",
]
