"""``eo doctor``: preflight checks of one pipeline against its broker, ledger, staging and Spark.

Each check gives a :class:`Finding` (``ok`` / ``warn`` / ``fail``) saying what was found and
what to change. A ``fail`` means a checkpoint would fail (or be refused) as things are;
a ``warn`` means it would run but something needs attention. The report is safe to run
when nothing failed (:attr:`DoctorReport.safe`).

The doctor changes nothing: it never registers the pipeline, pins a prefix, migrates the
ledger, creates topics or fetches jars; its only write is a probe file in the staging dir,
removed at once. The decisions are pure functions (``judge_*``,
unit-tested); :func:`run_doctor` gathers the facts from the real services and calls them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from airflow_provider_eo import names
from airflow_provider_eo.core.hanging import PipelineTransactions
from airflow_provider_eo.errors import PipelineIdentityMismatch, PipelineNameInUse
from airflow_provider_eo.kafka.transactions import JavaAdmin
from airflow_provider_eo.ledger import CheckpointRecord, CommitPlan, PipelineRecord
from airflow_provider_eo.pipeline import Pipeline

Severity = Literal["ok", "warn", "fail"]
SEVERITIES: tuple[Severity, ...] = ("ok", "warn", "fail")

#: Kafka's default ``transaction.max.timeout.ms``.
BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class Finding:
    """One check's result.

    :param check: short name of the check (``transaction-timeout``, ``sink-topic`` ...).
    :param severity: ``ok`` | ``warn`` | ``fail``.
    :param found: what was found.
    :param change: what to change (empty when nothing needs to change).
    """

    check: str
    severity: Severity
    found: str
    change: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form (``eo doctor --json``)."""
        return {"check": self.check, "severity": self.severity, "found": self.found, "change": self.change}


@dataclass(frozen=True)
class DoctorReport:
    """Every finding of one ``eo doctor`` run."""

    pipeline: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def safe(self) -> bool:
        """True when no finding failed (warnings allowed): safe to run."""
        return all(f.severity != "fail" for f in self.findings)

    @property
    def exit_code(self) -> int:
        """0 when safe to run, 1 when any check failed."""
        return 0 if self.safe else 1

    def count(self, severity: Severity) -> int:
        """How many findings have ``severity``."""
        return sum(1 for f in self.findings if f.severity == severity)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``eo doctor --json``)."""
        return {
            "pipeline": self.pipeline,
            "safe": self.safe,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "findings": [f.as_dict() for f in self.findings],
        }


# -- decisions (pure) -----------------------------------------------------------------------


def judge_transaction_timeout(
    pipeline_ms: int, broker_max_ms: Mapping[int, int | None], *, pipeline: str
) -> Finding:
    """The pipeline's ``transaction_timeout_ms`` against every broker's
    ``transaction.max.timeout.ms`` (``None``: the broker would not say, e.g. ACLs).

    Above any broker's maximum, ``init_transactions`` fails with INVALID_TRANSACTION_TIMEOUT
    on the coordinator of that broker: fail. Unknown for some broker: warn.
    """
    check = "transaction-timeout"
    known = {b: v for b, v in broker_max_ms.items() if v is not None}
    too_low = {b: v for b, v in known.items() if pipeline_ms > v}
    if too_low:
        lowest = min(too_low.values())
        brokers = ", ".join(f"broker {b}: {v}" for b, v in sorted(too_low.items()))
        return Finding(
            check,
            "fail",
            f"pipeline {pipeline!r}: transaction_timeout_ms={pipeline_ms} is above the broker's "
            f"transaction.max.timeout.ms ({brokers}); every commit would fail in "
            "init_transactions (INVALID_TRANSACTION_TIMEOUT)",
            f"set Pipeline(transaction_timeout_ms=...) to at most {lowest}, or raise "
            f"transaction.max.timeout.ms on the brokers to at least {pipeline_ms}",
        )
    unknown = sorted(b for b, v in broker_max_ms.items() if v is None)
    if unknown or not broker_max_ms:
        return Finding(
            check,
            "warn",
            f"transaction.max.timeout.ms could not be read from broker(s) {unknown or '(none answered)'} "
            f"(DescribeConfigs refused?); the pipeline uses transaction_timeout_ms={pipeline_ms}",
            "grant DescribeConfigs on the cluster to check it, or make sure transaction_timeout_ms "
            "stays at most the brokers' transaction.max.timeout.ms "
            f"(default {BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS})",
        )
    return Finding(
        check,
        "ok",
        f"transaction_timeout_ms={pipeline_ms} <= transaction.max.timeout.ms={min(known.values())} "
        f"on {len(known)} broker(s)",
    )


def judge_source_topics(
    topics: Sequence[str],
    live: Mapping[str, Sequence[int] | None],
    expected: Mapping[tuple[str, int], int],
    *,
    pipeline: str,
) -> list[Finding]:
    """Source topics exist with at least the partitions the ledger has ranges for.

    ``live``: partition ids per topic (``None``: the topic does not exist); ``expected``:
    the ledger's next start per (topic, partition) (its last checkpoints' ranges). A
    missing topic or a partition the ledger knows that is gone: fail (plan would fail, or
    the topic was re-created). New partitions: ok (they start from earliest).
    """
    out: list[Finding] = []
    for topic in topics:
        parts = live.get(topic)
        check = f"source-topic {topic}"
        if parts is None:
            out.append(
                Finding(
                    check,
                    "fail",
                    f"pipeline {pipeline!r}: source topic {topic!r} does not exist",
                    f"create it (kafka-topics --create --topic {topic} --partitions N) or fix "
                    "Pipeline(source_topics=...)",
                )
            )
            continue
        known = sorted(p for t, p in expected if t == topic)
        gone = [p for p in known if p not in parts]
        if gone:
            out.append(
                Finding(
                    check,
                    "fail",
                    f"pipeline {pipeline!r}: the ledger has ranges for {topic}{gone} but the topic "
                    f"now has {len(parts)} partition(s): was it deleted and re-created smaller?",
                    f"give {topic!r} its {max(known) + 1} partitions back (kafka-topics --alter "
                    "--partitions), or restore/reset the pipeline (`eo reset MODULE:ATTR --to ...`)",
                )
            )
            continue
        new = [p for p in parts if known and p not in known]
        extra = f"; {len(new)} new partition(s) {new} will start from earliest" if new else ""
        ledger_note = f", the ledger knows {len(known)}" if known else " (no checkpoint yet)"
        out.append(Finding(check, "ok", f"{topic!r} has {len(parts)} partition(s){ledger_note}{extra}"))
    return out


def judge_sink_topic(
    sink_topic: str,
    live_partitions: int | None,
    *,
    pipeline: str,
    unfinished: CheckpointRecord | None,
    last_committed: CheckpointRecord | None,
) -> list[Finding]:
    """The sink topic(s) exist with the partitions the ledger expects.

    The unfinished checkpoint's frozen commit plan is binding (fewer live partitions than the
    plan: its output cannot be placed, fail). The last committed checkpoint's plan is only a
    comparison: fewer partitions now means the topic was re-created (warn: the markers went
    with it). ``live_partitions`` is of ``sink_topic``; a plan naming another sink is
    reported by its own name with ``None`` (not looked up) unless it is the same topic.
    """
    out: list[Finding] = []
    check = f"sink-topic {sink_topic}"
    if live_partitions is None:
        out.append(
            Finding(
                check,
                "fail",
                f"pipeline {pipeline!r}: sink topic {sink_topic!r} does not exist",
                f"create it (kafka-topics --create --topic {sink_topic} --partitions N) or fix "
                "Pipeline(sink_topic=...)",
            )
        )
        return out
    plan = unfinished.commit_plan if unfinished is not None else None
    if plan is not None and plan.sink_topic == sink_topic and live_partitions < plan.sink_partitions:
        out.append(
            Finding(
                check,
                "fail",
                f"pipeline {pipeline!r}: checkpoint {unfinished.checkpoint_id if unfinished else '?'} "
                f"({unfinished.state.value if unfinished else '?'}) is frozen to publish on "
                f"{plan.sink_partitions} partitions of {sink_topic!r}, which now has {live_partitions}",
                f"give {sink_topic!r} {plan.sink_partitions} partitions again (kafka-topics --alter "
                "--partitions), or abort the checkpoint (`eo abort MODULE:ATTR "
                f"{unfinished.checkpoint_id if unfinished else 'ID'} --reason ...`) so it is replanned",
            )
        )
        return out
    done = last_committed.commit_plan if last_committed is not None else None
    if done is not None and done.sink_topic == sink_topic and live_partitions < done.sink_partitions:
        out.append(
            Finding(
                check,
                "warn",
                f"{sink_topic!r} has {live_partitions} partition(s) but checkpoint "
                f"{last_committed.checkpoint_id if last_committed else '?'} was committed to "
                f"{done.sink_partitions}: the topic was re-created (its committed output and commit "
                "markers are gone)",
                "check that this is intended; the next checkpoint publishes on the topic as it is",
            )
        )
        return out
    why = (
        f", the unfinished checkpoint's plan needs {plan.sink_partitions}"
        if plan is not None and plan.sink_topic == sink_topic
        else ""
    )
    out.append(Finding(check, "ok", f"{sink_topic!r} has {live_partitions} partition(s){why}"))
    return out


def transactional_namespace(prefix: str, pipeline: str) -> str:
    """The ``{prefix}.{pipeline}.`` every commit shard's transactional id starts with."""
    return f"{prefix}.{pipeline}."


def judge_prefix(
    pipeline: str,
    configured: str,
    pinned: str | None,
    others: Iterable[tuple[str, str | None]],
) -> Finding:
    """The configured transactional-id prefix against the one pinned in the ledger, and
    the namespace ``{prefix}.{pipeline}.`` against every other pipeline's in the ledger.

    A different pinned prefix: the plan/commit would be refused (fail). Another pipeline
    whose namespace is the same (``eo`` + ``a.b`` and ``eo.a`` + ``b`` both give
    ``eo.a.b.<shard>``): both would fence each other's producers (fail). Pipelines sharing
    just the prefix are fine (their ids differ by pipeline name).
    """
    check = "transactional-id-prefix"
    ours = transactional_namespace(pinned or configured, pipeline)
    clash = sorted(
        name
        for name, prefix in others
        if prefix is not None and name != pipeline and transactional_namespace(prefix, name) == ours
    )
    if pinned is not None and pinned != configured:
        return Finding(
            check,
            "fail",
            f"pipeline {pipeline!r} is configured with transactional_id_prefix={configured!r} but "
            f"the ledger pinned {pinned!r} at its first plan; plan and commit refuse it",
            f"set Pipeline(transactional_id_prefix={pinned!r}) (Kafka fences committers only "
            "within one transactional id), or use a new pipeline name",
        )
    if clash:
        return Finding(
            check,
            "fail",
            f"transactional ids {ours}<shard> of pipeline {pipeline!r} are also those of "
            f"pipeline(s) {clash} in the ledger: their committers would fence each other",
            "choose another transactional_id_prefix (before the first plan) or another pipeline name",
        )
    state = f"pinned {pinned!r}" if pinned is not None else f"{configured!r}, pinned at the first plan"
    return Finding(check, "ok", f"prefix {state}; ids {ours}<shard> are used by no other pipeline")


def judge_marker_group(group: str, members: Sequence[str], identity_error: str | None) -> list[Finding]:
    """The marker group has no members (it is never joined: anything in it is foreign) and
    its markers carry this pipeline's identity (``identity_error``: the refusal message of
    :func:`airflow_provider_eo.core.markers.check_marker_identity`, else ``None``)."""
    out: list[Finding] = []
    if members:
        out.append(
            Finding(
                "marker-group members",
                "fail",
                f"the commit-marker group {group!r} has active member(s) {list(members)}: something "
                "consumes with the provider's own group id",
                f"stop that consumer or give it another group.id; {group!r} must never be used by a consumer",
            )
        )
    else:
        out.append(Finding("marker-group members", "ok", f"{group!r} has no members"))
    if identity_error is not None:
        out.append(
            Finding(
                "marker-group identity",
                "fail",
                identity_error,
                "point the pipeline at its original ledger, or start over under a new pipeline name",
            )
        )
    else:
        out.append(
            Finding(
                "marker-group identity",
                "ok",
                "the commit markers carry this ledger's pipeline identity (or there are none yet)",
            )
        )
    return out


def judge_same_name(pipeline: str, refusal: str | None) -> Finding:
    """No other deployment of this pipeline name (another ledger) publishes to another sink
    (``refusal``: the message of
    :func:`airflow_provider_eo.core.sink_guard.check_other_deployments`, else ``None``)."""
    if refusal is not None:
        return Finding(
            "same-name deployments",
            "fail",
            refusal,
            "give one of the two deployments another pipeline name; if the other one is "
            "retired for good, delete its markers (the command is above)",
        )
    return Finding(
        "same-name deployments",
        "ok",
        f"no other ledger's commit markers for {pipeline!r} on any other topic",
    )


def judge_open_transactions(
    sink_topic: str,
    stable: Mapping[int, int],
    high: Mapping[int, int],
    *,
    unfinished: CheckpointRecord | None,
    transaction_timeout_ms: int,
    now: dt.datetime,
    client_version: str,
) -> Finding:
    """Open transactions on the sink partitions, and commits of ours in flight too long.

    ``stable`` (last stable offset) below ``high`` (high watermark) means a transaction is
    open on that partition: read_committed consumers wait until it ends. confluent-kafka has
    no ListTransactions/DescribeTransactions (:func:`judge_transactions` has their owner and
    age from Kafka's Java admin client); the ledger says whether a commit of ours started and when. A shard of
    the unfinished checkpoint PENDING for longer than the transaction timeout is a commit
    that died (warn: ``eo commit`` fences it and finishes by the marker).
    """
    check = "open-transactions"
    open_parts = sorted(p for p in high if stable.get(p, high[p]) < high[p])
    limit = dt.timedelta(milliseconds=transaction_timeout_ms)
    stale = []
    if unfinished is not None:
        for sh in unfinished.shards:
            updated = sh.updated_at if sh.updated_at.tzinfo else sh.updated_at.replace(tzinfo=dt.UTC)
            if sh.state.value == "PENDING" and now - updated > limit:
                stale.append(
                    f"shard {sh.shard} ({sh.transactional_id}) since {updated.isoformat(timespec='seconds')}"
                )
    unlisted = (
        f"confluent-kafka {client_version} cannot describe broker transactions: the "
        "'transactions' check lists them with Kafka's Java admin client"
    )
    if stale:
        cid = unfinished.checkpoint_id if unfinished is not None else "?"
        return Finding(
            check,
            "warn",
            f"checkpoint {cid}: commit started and unfinished for longer than transaction_timeout_ms="
            f"{transaction_timeout_ms}: {'; '.join(stale)}"
            + (f"; open transaction(s) on {sink_topic}{open_parts}" if open_parts else ""),
            "run `eo recover MODULE:ATTR` (or `eo commit MODULE:ATTR --checkpoint "
            f"{cid}`): it fences those transactional ids (init_transactions aborts what is open) "
            "and publishes only what the markers lack",
        )
    if open_parts:
        lag = ", ".join(f"[{p}] {stable.get(p)} < {high[p]}" for p in open_parts)
        return Finding(
            check,
            "warn",
            f"open transaction(s) on {sink_topic} (last stable offset < high watermark: {lag}); "
            f"no commit of ours is pending in the ledger; {unlisted}",
            "run `eo recover MODULE:ATTR`: it fences every transactional id of this pipeline, "
            "which aborts an open transaction of ours; if one stays open it is not ours: find its "
            f"owner with `kafka-transactions.sh --bootstrap-server ... find-hanging --topic {sink_topic}` "
            "and abort it there",
        )
    return Finding(
        check, "ok", f"no open transaction on {sink_topic} (last stable offset = high watermark); {unlisted}"
    )


def judge_transactions(
    listed: PipelineTransactions | None,
    error: str | None,
    *,
    pipeline: str,
    unfinished: CheckpointRecord | None,
    now: dt.datetime,
) -> list[Finding]:
    """The open transactions Kafka's Java admin client listed on the sink and the marker
    group's ``__consumer_offsets`` partition (``listed``), one finding each: ours (a commit
    shard's transactional id of this pipeline, or a hanging one whose producer id the ledger
    recorded) with their age and the ledger's shard, foreign ones named as foreign.

    Ours is ``ok`` while a committer holds the unfinished checkpoint's lease and the
    transaction is younger than its timeout (a commit in progress), else ``warn``
    (``eo recover --abort-hanging`` ends it). Foreign: ``warn``, never touched by eo.
    ``error``: the listing could not run (``warn``, naming what is missing).
    """
    check = "transactions"
    if listed is None:
        return [
            Finding(
                check,
                "warn",
                f"open transactions were not listed: {error}",
                "install a Java 17+ runtime and run `eo setup jars` where the doctor runs (Kafka's "
                "Java admin client lists transactions; librdkafka cannot)",
            )
        ]
    where = ", ".join(sorted({t for t, _p in listed.partitions}))
    out: list[Finding] = []
    lease = unfinished.commit_lease_until if unfinished is not None else None
    if lease is not None and lease.tzinfo is None:
        lease = lease.replace(tzinfo=dt.UTC)
    live = unfinished is not None and lease is not None and lease > now
    for a in listed.transactions:
        line = a.describe(listed.now_ms)
        if not a.ours:
            out.append(
                Finding(
                    check,
                    "warn",
                    f"{line}: not pipeline {pipeline!r}'s; read_committed consumers of its partitions "
                    "wait until it ends",
                    "eo never ends it: ask its owner, or, if it is known to be abandoned, abort it with "
                    "`kafka-transactions.sh --bootstrap-server ... abort`",
                )
            )
        elif live and not a.txn.hanging(listed.now_ms) and unfinished is not None:
            out.append(
                Finding(
                    check,
                    "ok",
                    f"{line}; checkpoint {unfinished.checkpoint_id} is being committed by "
                    f"{unfinished.commit_owner!r} (lease until {lease.isoformat() if lease else '?'})",
                )
            )
        else:
            out.append(
                Finding(
                    check,
                    "warn",
                    f"{line}; no committer holds a live commit lease"
                    if not live
                    else f"{line}; open longer than its transaction timeout or unknown to its coordinator",
                    "run `eo recover MODULE:ATTR --abort-hanging` (once no committer of this pipeline is "
                    "running): it ends our open transactions and commits a PREPARED checkpoint by its "
                    "markers",
                )
            )
    if listed.errors:
        out.append(
            Finding(
                check,
                "warn",
                f"some partitions could not be described: {'; '.join(listed.errors)}",
                "grant Read on those topics (DescribeProducers) to see hanging transactions there",
            )
        )
    if not listed.transactions:
        out.append(
            Finding(check, "ok", f"no open transaction on {where} (listed with Kafka's Java admin client)")
        )
    return out


_KAFKA_CONNECTOR = re.compile(
    r"spark-sql-kafka-0-10_(?P<scala>[0-9.]+)[:-](?P<version>\d+\.\d+\.\d+[^:,/]*?)(?:\.jar)?$"
)


def judge_connector(
    spark_conf: Mapping[str, str],
    spark_version: str,
    *,
    cached_jars: Sequence[str],
    exists: Any = os.path.exists,
) -> Finding:
    """The Spark Kafka connector: given in the pipeline's ``spark.jars.packages`` /
    ``spark.jars``, at the installed Spark version; else eo's local jar cache
    (``cached_jars``, what ``eo dev jars`` fetched), which ``get_spark`` uses when
    ``spark.jars`` is not set."""
    check = "spark-connector"
    given: list[tuple[str, str]] = []  # (where, coordinate or path)
    for key in ("spark.jars.packages", "spark.jars"):
        for item in (spark_conf.get(key) or "").split(","):
            item = item.strip()
            if "spark-sql-kafka-0-10" in item:
                given.append((key, item))
    for key, item in given:
        m = _KAFKA_CONNECTOR.search(item)
        if m is not None and m.group("version") != spark_version:
            return Finding(
                check,
                "fail",
                f"{key} gives {item!r}, but Spark is {spark_version}: the connector must match Spark exactly",
                f"use org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}",
            )
        if key == "spark.jars" and "://" not in item and not exists(item):
            return Finding(check, "fail", f"spark.jars names {item!r}, which does not exist", "fix the path")
    if given:
        return Finding(check, "ok", f"connector given in spark_conf: {', '.join(i for _k, i in given)}")
    if "spark.jars" in spark_conf:
        return Finding(
            check,
            "fail",
            "spark_conf sets spark.jars without spark-sql-kafka-0-10, so eo's connector jars are "
            "not added: the Kafka source would be missing",
            f"add org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version} to spark.jars.packages "
            "(or its jars to spark.jars)",
        )
    if cached_jars:
        return Finding(
            check,
            "ok",
            f"no connector in spark_conf; eo's cached spark-sql-kafka-0-10 {spark_version} jars "
            f"({len(cached_jars)} files) are added by get_spark",
        )
    return Finding(
        check,
        "warn",
        f"no connector in spark_conf and eo's jar cache has no spark-sql-kafka-0-10 {spark_version}: "
        "the first local prepare fetches it with Maven (needs Maven and Maven Central)",
        f"set spark_conf spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version} "
        "(clusters), or run `eo dev jars` once (local development)",
    )


def judge_ledger(current: str | None, head: str, *, dialect: str, url: str) -> Finding:
    """The ledger's schema revision against the package's head."""
    check = "ledger"
    if current == head:
        return Finding(check, "ok", f"{url} reachable, schema at head ({head})")
    if current is None:
        return Finding(
            check,
            "warn",
            f"{url} reachable but has no ledger schema yet",
            "none needed: the first plan creates it (or run `eo ledger upgrade --ledger-url ...`)",
        )
    if dialect == "sqlite":
        return Finding(
            check,
            "warn",
            f"{url} has schema revision {current}, this package needs {head}",
            "none needed: SQLite ledgers are upgraded when opened (or run `eo ledger upgrade`)",
        )
    return Finding(
        check,
        "fail",
        f"{url} has schema revision {current}, this package needs {head}: it refuses to run on it",
        "run `eo ledger upgrade --ledger-url ...` once",
    )


def judge_staging(staging_dir: str, error: str | None) -> Finding:
    """Whether a probe file could be written and removed in the staging dir."""
    if error is None:
        return Finding("staging", "ok", f"{staging_dir} is writable")
    return Finding(
        "staging",
        "fail",
        f"cannot write to staging_dir {staging_dir}: {error}",
        "fix the permissions / credentials, or set Pipeline(staging_dir=...) to a place the "
        "prepare job (Spark executors) and the commit can both reach",
    )


def judge_staging_shared(
    location: str, written: int | None, seen: int, host: str, error: str | None
) -> Finding:
    """Whether the rows Spark's executors wrote under the staging location are all visible
    from this process (``written`` and ``seen`` from the staging probe)."""
    check = "staging shared"
    if error is not None:
        return Finding(
            check,
            "fail",
            f"Spark could not write a probe under {location}: {error}",
            "check spark_conf (master, resources) and that the executors can write there",
        )
    if written == seen:
        return Finding(
            check,
            "ok",
            f"the {written} rows Spark's executors wrote under {location} are visible here ({host})",
        )
    return Finding(
        check,
        "fail",
        f"Spark's executors wrote {written} rows under {location} but this process ({host}) sees "
        f"{seen}: a prepare would be refused (StagingError) and the commit could not read it",
        "staging_dir must be one location shared by the Spark driver, every executor and the "
        "committer (a shared filesystem mounted at the same path everywhere, or hdfs://, s3a://, "
        "gs://, abfss://); a local folder works only with a local master. Run `eo doctor` where "
        "the commit runs",
    )


# -- gathering (talks to the services) ------------------------------------------------------


class QueryLocationFacts(Protocol):
    """What a Structured Streaming query's checkpoint location says (read by the caller:
    the doctor does not read Spark's files itself)."""

    @property
    def location(self) -> str:
        """The location as given."""

    @property
    def query_id(self) -> str | None:
        """The query's id in its ``metadata`` (None: no query there)."""

    @property
    def latest_offsets(self) -> int | None:
        """The newest batch of its offset log."""

    @property
    def latest_commit(self) -> int | None:
        """The newest batch of its commit log."""


def judge_query(
    pipeline: str,
    newest: CheckpointRecord,
    run: Mapping[str, Any] | None,
    location: QueryLocationFacts | None,
    location_error: str | None = None,
) -> list[Finding]:
    """The checks of a pipeline whose checkpoints are a Structured Streaming query's batches
    (``newest``: the ledger's newest live one, with ``query_id`` and ``batch_id``):

    - ``query-run``: the query's newest run in the ledger (``run``: the dashboard's stream
      row, ``state`` ``RUNNING``/``STALE``/``ENDED``/``FAILED``/``LOST``);
    - ``query-batch``: a batch PLANNED or PREPARED waits for the query to run again;
    - ``query-identity`` and ``query-position``: the checkpoint location's query id and
      commit log against the ledger (``location``: None when not known here).
    """
    query, batch = newest.query_id, newest.batch_id
    out: list[Finding] = []
    live = run is not None and run.get("state") == "RUNNING"
    if run is None:
        out.append(
            Finding("query-run", "warn", f"pipeline {pipeline!r}: no run of query {query} is recorded")
        )
    elif live:
        out.append(
            Finding(
                "query-run",
                "ok",
                f"query {query} runs (run {run.get('run_id')} on {run.get('host')} pid {run.get('pid')}, "
                f"heartbeat {run.get('heartbeat_age_s')}s ago)",
            )
        )
    elif run.get("state") == "STALE":
        out.append(
            Finding(
                "query-run",
                "warn",
                f"run {run.get('run_id')} of query {query} on {run.get('host')} pid {run.get('pid')} is "
                f"RUNNING in the ledger but silent for {run.get('heartbeat_age_s')}s (killed, or its "
                "host is gone)",
                "restart the query from its checkpoint location; its start declares the silent run LOST",
            )
        )
    else:
        severity: Severity = "warn" if run.get("state") in ("FAILED", "LOST") else "ok"
        out.append(
            Finding(
                "query-run",
                severity,
                f"query {query} is not running: run {run.get('run_id')} {run.get('state')}"
                + (f" ({run.get('reason')})" if run.get("reason") else ""),
                "" if severity == "ok" else "fix what the reason says, then start the query again",
            )
        )
    waiting = newest.state.value in ("PLANNED", "PREPARED")
    if waiting:
        does = "commits its staged output" if newest.state.value == "PREPARED" else "stages and commits it"
        out.append(
            Finding(
                "query-batch",
                "ok" if live else "warn",
                f"batch {batch} (checkpoint {newest.checkpoint_id}) is {newest.state.value}"
                + ("; the running query finishes it" if live else "; no query runs to finish it"),
                "" if live else f"start the query from its checkpoint location: its next batch {does}",
            )
        )
    else:
        out.append(
            Finding(
                "query-batch",
                "ok",
                f"batch {batch} (checkpoint {newest.checkpoint_id}) is {newest.state.value}; none waits",
            )
        )
    if location is None:
        out.append(
            Finding(
                "query-identity",
                "fail" if location_error else "warn",
                location_error or "the query's checkpoint location is not known here: not checked",
                "check the location is readable from here"
                if location_error
                else "give KafkaExactlyOnceSink(checkpoint_location=...)",
            )
        )
        return out
    where = f"checkpoint location {location.location!r}"
    if location.query_id is None:
        out.append(
            Finding(
                "query-identity",
                "fail",
                f"{where} holds no query (no 'metadata'): a query started there gets a new id, which "
                f"the sink refuses (its batches are query {query}'s)",
                "start the query from the location it ran from, or from a copy of it",
            )
        )
        return out
    if location.query_id != query:
        out.append(
            Finding(
                "query-identity",
                "fail",
                f"{where} is query {location.query_id}'s, the ledger's batches are query {query}'s: the "
                "sink refuses its batches (QueryIdentityMismatch)",
                "start the query from its own location, or give KafkaExactlyOnceSink(allow_new_query=True) "
                "to let the new query continue where the old one ended",
            )
        )
        return out
    out.append(Finding("query-identity", "ok", f"{where} is query {query}'s, as the ledger's batches"))
    assert batch is not None
    done = -1 if location.latest_commit is None else location.latest_commit
    if done > batch:
        out.append(
            Finding(
                "query-position",
                "fail",
                f"{where} committed batch {done}, the ledger knows batches up to {batch}: its next batch's "
                "ranges do not continue the ledger's, the sink refuses it",
                "use the ledger this query wrote to (ledger_url), or start the query from a copy at "
                f"batch {batch} or below",
            )
        )
    elif done < batch - 1:
        out.append(
            Finding(
                "query-position",
                "warn",
                f"{where} is at batch {done}, behind the ledger's batch {batch} (a restored copy): the "
                f"query re-runs batches {done + 1}..{batch} without publishing them (already published); "
                f"the batch after {batch} is published only when its ranges start where batch {batch} "
                "ended, else the sink refuses it",
                "start from a copy at the ledger's newest batch to continue exactly",
            )
        )
    else:
        out.append(
            Finding(
                "query-position",
                "ok",
                f"{where} committed batch {done}; the ledger's newest is batch {batch} "
                f"({newest.state.value})"
                + (
                    f": the query's next start re-runs batch {batch} without publishing it again"
                    if done < batch and newest.state.value == "COMMITTED"
                    else ""
                ),
            )
        )
    return out


def _broker_max_timeouts(config: Mapping[str, Any]) -> dict[int, int | None]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.login import check_login

    # A refused login or TLS handshake is named at once (librdkafka would retry it until the
    # time-out and report a transport failure).
    check_login(config)
    client = admin.admin_client(config)
    md = client.list_topics(timeout=15)
    out: dict[int, int | None] = {}
    futures = client.describe_configs(
        [ConfigResource(ResourceType.BROKER, str(b)) for b in sorted(md.brokers)], request_timeout=15
    )
    for res, fut in futures.items():
        try:
            entry = fut.result(timeout=15).get("transaction.max.timeout.ms")
            out[int(res.name)] = int(entry.value) if entry is not None and entry.value else None
        except Exception:  # refused by ACLs: reported as unknown
            out[int(res.name)] = None
    return out


def _live_partitions(config: Mapping[str, Any], topics: Iterable[str]) -> dict[str, list[int] | None]:
    from airflow_provider_eo.kafka import admin

    md = admin.admin_client(config).list_topics(timeout=15)
    out: dict[str, list[int] | None] = {}
    for t in topics:
        meta = md.topics.get(t)
        out[t] = None if meta is None or meta.error is not None else sorted(meta.partitions)
    return out


def _marker_members(config: Mapping[str, Any], group: str) -> list[str]:
    from confluent_kafka import KafkaException

    from airflow_provider_eo.kafka import admin

    deadline = time.monotonic() + 30
    while True:
        fut = admin.admin_client(config).describe_consumer_groups([group], request_timeout=15)[group]
        try:
            desc = fut.result(timeout=15)
            break
        except KafkaException as exc:
            # A group nobody joined yet answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS
            # for a moment on a fresh broker: transient until the deadline.
            if not admin._transient(exc.args[0]) or time.monotonic() >= deadline:
                raise
            time.sleep(0.3)
    return [f"{m.client_id}@{m.host}" for m in desc.members]


def _staging_probe(pipeline: Pipeline) -> str | None:
    """Write and remove a probe file under the pipeline's ``staging_dir``, opened as the
    prepare and the commit open it (:mod:`airflow_provider_eo.staging_fs`); the error text
    (naming where the S3 credentials came from), else None."""
    from airflow_provider_eo import staging_fs

    store = staging_fs.store_for(pipeline)
    try:
        fs, root = store.open(pipeline.staging_dir)
        fs.create_dir(root, recursive=True)
        probe = f"{root.rstrip('/')}/.eo-doctor-{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as f:
            f.write(b"eo doctor\n")
        fs.delete_file(probe)
    except Exception as exc:  # any filesystem error is the finding
        where = ""
        if pipeline.staging_dir.split("://", 1)[0].lower() in staging_fs.S3_SCHEMES:
            where = f" ({store.s3_for(pipeline.staging_dir.split('://', 1)[1].split('/', 1)[0]).describe()})"
        return f"{type(exc).__name__}: {exc}{where}"
    return None


def _cached_connector_jars(spark_version: str) -> list[str]:
    from airflow_provider_eo.stack.paths import state_dir

    out = state_dir() / "jars" / f"spark-sql-kafka-{spark_version}"
    return [str(p) for p in sorted(out.glob("*.jar"))] if (out / ".complete").is_file() else []


def _identity_error(pipeline: Pipeline, record: PipelineRecord | None) -> str | None:
    """The refusal :func:`check_marker_identity` gives, else None. An unregistered pipeline
    has no identity yet: any marker naming one is foreign (a re-created ledger)."""
    from airflow_provider_eo.core.markers import check_marker_identity

    identity = record.identity if record is not None else "(none: not registered in this ledger)"
    try:
        check_marker_identity(pipeline, identity)
    except PipelineIdentityMismatch as exc:
        return str(exc)
    return None


def _same_name_refusal(pipeline: Pipeline, record: PipelineRecord | None) -> str | None:
    """The refusal :func:`check_other_deployments` gives, else None (an unregistered
    pipeline has no identity: every identified marker elsewhere is another deployment's)."""
    from airflow_provider_eo.core.sink_guard import check_other_deployments

    try:
        check_other_deployments(pipeline, record.identity if record is not None else None)
    except PipelineNameInUse as exc:
        return str(exc)
    return None


def _query_findings(
    ledger: Any, pipeline: str, newest: CheckpointRecord, read: Callable[[], QueryLocationFacts] | None
) -> list[Finding]:
    """:func:`judge_query` on the query's run in the ledger and its checkpoint location."""
    run = ledger.pipeline_overview(pipeline).get("stream")
    facts, bad = (None, None) if read is None else _guard("query", read)
    error = None if bad is None else f"cannot read the query's checkpoint location: {bad.found}"
    return judge_query(pipeline, newest, run, facts, error)


def _guard(check: str, fn: Any, *args: Any) -> tuple[Any, Finding | None]:
    """Run ``fn``; an error becomes a failed finding of ``check`` (the doctor reports, it does
    not stop at the first broken service)."""
    try:
        return fn(*args), None
    except Exception as exc:  # every failure here is a finding
        return None, Finding(check, "fail", f"{type(exc).__name__}: {exc}", "see the message")


def run_doctor(
    pipeline: Pipeline,
    *,
    now: dt.datetime | None = None,
    spark: bool = True,
    staging_probe: Callable[[Pipeline, str], tuple[int, int]] | None = None,
    query_location: Callable[[], QueryLocationFacts] | None = None,
    transaction_admin: JavaAdmin | None = None,
    list_transactions: bool | None = None,
) -> DoctorReport:
    """Every preflight check of ``pipeline``; changes nothing (see the module docstring).

    :param spark: also check the staging dir and the Spark connector; the plan task's
        preflight passes ``False`` (it runs where plans are made, not where Spark runs).
    :param staging_probe: a Spark write under the staging location and this process's
        count of it: (rows written, rows seen) (the CLI passes
        :func:`airflow_provider_eo.spark.probe.staging_probe`; core never imports Spark).
        ``None``: not checked.
    :param query_location: reads the checkpoint location of the Structured Streaming query
        whose batches the checkpoints are (the CLI passes the sink's); ``None``: unknown.
    :param transaction_admin: the Java admin tool that lists open transactions (default:
        this installation's; when it cannot run, the ``transactions`` finding says why).
    :param list_transactions: list the open transactions (a short JVM run); ``None``: with
        the full doctor (``spark``), not in the plan task's preflight.
    """
    import confluent_kafka

    from airflow_provider_eo.core.hanging import RECENT_CHECKPOINTS, read_pipeline_transactions
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.client_config import librdkafka_config
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.ledger.errors import CheckpointNotFound
    from airflow_provider_eo.stack.maven import installed_spark_version

    findings: list[Finding] = []
    now = now or dt.datetime.now(dt.UTC)

    # 1. The ledger: reachable, migrated; what it knows of this pipeline.
    record: PipelineRecord | None = None
    others: list[tuple[str, str | None]] = []
    unfinished: CheckpointRecord | None = None
    committed: CheckpointRecord | None = None
    expected: dict[tuple[str, int], int] = {}
    known_ids: list[str] = []
    recent: list[CheckpointRecord] = []
    ledger = Ledger(pipeline.ledger_url, create=False)
    try:
        current, bad = _guard("ledger", ledger.current_revision)
        if bad is not None:
            findings.append(
                Finding(
                    "ledger",
                    "fail",
                    f"{ledger.url}: {bad.found}",
                    "check ledger_url and that the database is up",
                )
            )
        else:
            findings.append(
                judge_ledger(current, ledger.head_revision(), dialect=ledger.dialect, url=ledger.url)
            )
            if current is not None:
                others = [(p.name, p.transactional_id_prefix) for p in ledger.list_pipelines()]
                try:
                    record = ledger.get_pipeline(pipeline.name)
                except CheckpointNotFound:
                    record = None
                if record is not None:
                    unfinished = ledger.unfinished(pipeline.name)
                    committed = ledger.last_committed(pipeline.name)
                    expected = dict(ledger.next_starts(pipeline.name))
                    known_ids = ledger.transactional_ids(pipeline.name)
                    recent = ledger.list_checkpoints(pipeline.name, limit=RECENT_CHECKPOINTS)
                    newest = unfinished or committed
                    if newest is not None and newest.query_id is not None:
                        findings.extend(_query_findings(ledger, pipeline.name, newest, query_location))
    finally:
        ledger.close()
    findings.append(
        judge_prefix(
            pipeline.name,
            pipeline.transactional_id_prefix,
            record.transactional_id_prefix if record is not None else None,
            others,
        )
    )

    # 2. Kafka: broker settings, topics, marker group, open transactions.
    config = librdkafka_config(pipeline.kafka)
    maxes, bad = _guard("kafka", _broker_max_timeouts, config)
    if bad is not None:
        findings.append(
            Finding(
                "kafka",
                "fail",
                f"cannot reach Kafka at {config.get('bootstrap.servers')!r}: {bad.found}",
                "check bootstrap.servers and that the cluster is up; the Kafka checks were skipped",
            )
        )
    else:
        findings.append(
            judge_transaction_timeout(pipeline.transaction_timeout_ms, maxes, pipeline=pipeline.name)
        )
        plan: CommitPlan | None = unfinished.commit_plan if unfinished is not None else None
        sinks = [pipeline.sink_topic] + (
            [plan.sink_topic] if plan and plan.sink_topic != pipeline.sink_topic else []
        )
        live = _live_partitions(config, [*pipeline.source_topics, *sinks])
        findings.extend(judge_source_topics(pipeline.source_topics, live, expected, pipeline=pipeline.name))
        for sink in sinks:
            parts = live.get(sink)
            findings.extend(
                judge_sink_topic(
                    sink,
                    None if parts is None else len(parts),
                    pipeline=pipeline.name,
                    unfinished=unfinished,
                    last_committed=committed,
                )
            )
        group = plan.marker_group if plan is not None else names.marker_group(pipeline)
        members, bad = _guard("marker-group members", _marker_members, config, group)
        sink_live = live.get(pipeline.sink_topic)
        identity_error = _identity_error(pipeline, record) if sink_live is not None else None
        if bad is not None:
            findings.append(bad)
            findings.extend(
                f for f in judge_marker_group(group, [], identity_error) if f.check != "marker-group members"
            )
        else:
            findings.extend(judge_marker_group(group, members, identity_error))
        refusal, bad = _guard("same-name deployments", _same_name_refusal, pipeline, record)
        findings.append(bad if bad is not None else judge_same_name(pipeline.name, refusal))
        txn_sink = plan.sink_topic if plan is not None else pipeline.sink_topic
        txn_parts = live.get(txn_sink)
        if txn_parts is not None:
            offsets, bad = _guard("open-transactions", admin.sink_offsets, config, txn_sink, len(txn_parts))
            if bad is not None:
                findings.append(bad)
            else:
                stable, high = offsets
                findings.append(
                    judge_open_transactions(
                        txn_sink,
                        stable,
                        high,
                        unfinished=unfinished,
                        transaction_timeout_ms=pipeline.transaction_timeout_ms,
                        now=now,
                        client_version=str(getattr(confluent_kafka, "__version__", "?")),
                    )
                )
        if spark if list_transactions is None else list_transactions:
            listed, bad = _guard(
                "transactions",
                lambda: read_pipeline_transactions(
                    pipeline, plan=plan, known_ids=known_ids, checkpoints=recent, admin=transaction_admin
                ),
            )
            findings.extend(
                judge_transactions(
                    listed,
                    bad.found if bad is not None else None,
                    pipeline=pipeline.name,
                    unfinished=unfinished,
                    now=now,
                )
            )

    # 3. Staging and Spark.
    if not spark:
        return DoctorReport(pipeline.name, tuple(findings))
    findings.append(judge_staging(pipeline.staging_dir, _staging_probe(pipeline)))
    if staging_probe is not None:
        from airflow_provider_eo import staging

        # Where the prepares stage: pinned in the ledger at the first one, else resolved here.
        location = (record.staging_dir if record is not None else None) or staging.resolve_location(
            pipeline.staging_dir
        )[0]
        try:
            written, seen = staging_probe(pipeline, location)
            error = None
        except Exception as exc:  # the finding names it
            written, seen, error = None, 0, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        findings.append(judge_staging_shared(location, written, seen, socket.gethostname(), error))
    try:
        version = installed_spark_version()
    except ImportError:
        findings.append(
            Finding(
                "spark-connector",
                "warn",
                "pyspark is not installed where `eo doctor` runs: the connector version was not checked",
                "run the doctor where the prepare job is submitted from",
            )
        )
    else:
        findings.append(
            judge_connector(pipeline.spark_conf, version, cached_jars=_cached_connector_jars(version))
        )
    return DoctorReport(pipeline.name, tuple(findings))
