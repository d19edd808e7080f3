"""Least-privilege Kafka ACLs on a broker with KRaft's ``StandardAuthorizer``.

The module starts its own SASL_SSL (SCRAM) broker with the authorizer on and
``allow.everyone.if.no.acl.found=false``: a principal may do only what an ACL grants.
``eo-broker`` is the broker's own user and the super user the fixtures create topics and
ACLs with (the controller listener is PLAINTEXT, so the broker's own controller requests
arrive as ``User:ANONYMOUS``: a super user too; no client reaches that listener). Every
other user holds exactly the ACLs :func:`airflow_provider_eo.kafka.acls.pipeline_acls`
gives it, applied through the AdminClient's ``create_acls``.

* With one SCRAM user per role (planner, prepare, committer, audit, watcher/UI), each role
  running as its own user, a checkpoint with a dead letter, then a stream as one user,
  are counted against the source: every source record once in the sink or the dead-letter
  topic, nothing else.
* Each ACL of the one-principal list removed in turn: the first role that needs it fails
  within seconds with a :class:`KafkaAccessDenied` naming the operation and the resource
  (never a hang, a retry loop or the poison-record search).
* A Structured Streaming query (Spark's own Kafka source, as the ``query`` user) writing
  through ``KafkaExactlyOnceSink`` (as the ``sink`` user), audited as the ``audit`` user,
  each holding exactly its role's ACLs: every source record once in the sink; a sink ACL
  removed fails the query within seconds naming it.
* The audit runs as the audit user with only its ACLs: its READ on the sink removed, the
  audit's error names it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import wait_for
from eo_source_sink import compare_source_and_sink
from eo_tls import issue, make_ca

from airflow_provider_eo import names
from airflow_provider_eo.errors import EoError, KafkaAccessDenied
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.acls import AclEntry, acl_bindings, pipeline_acls, role_acls
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import ListenerSecurity, LocalKafka

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

MECHANISM = "SCRAM-SHA-512"
ROLE_USERS = ("planner", "prepare", "committer", "audit", "watcher", "doctor", "recover", "query", "sink")
#: How long a refused role may take to fail (the error must come at once, not after retries).
REFUSAL_S = 60.0
#: How long the planner, the first role to meet a refused marker group, may take to fail: a
#: refused coordinator look-up is retried silently by librdkafka until its 30 s time-out, so
#: the read asks the broker early whether the group is refused.
MARKER_REFUSAL_S = 15.0


@dataclass(frozen=True)
class AclBroker:
    """The module's authorizing broker: its super user's config and one config per user."""

    bootstrap: str
    ca: Path
    passwords: dict[str, str]

    def config(self, user: str) -> dict[str, Any]:
        """librdkafka settings of ``user``."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user,
            "sasl.password": self.passwords[user],
            "ssl.ca.location": str(self.ca),
        }


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    """A SASL_SSL broker with StandardAuthorizer, a super user and one SCRAM user per role."""
    from airflow_provider_eo.kafka.admin import close_shared_clients
    from airflow_provider_eo.kafka.publisher import close_producers

    folder = tmp_path_factory.mktemp("acl-broker")
    ca = make_ca(folder)
    server = issue(ca, folder, "broker", server=True)
    key_store = folder / "broker-key-store.pem"
    key_store.write_text(server.key.read_text() + server.cert.read_text())
    passwords = {name: uuid.uuid4().hex for name in ("eo-broker", "eo", *ROLE_USERS)}
    kafka = LocalKafka(
        home=folder / "kafka",
        security=ListenerSecurity(key_store=key_store, ca=ca.cert, users=passwords, mechanism=MECHANISM),
        extra_config={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            # The broker's own user (inter-broker listener) and the controller listener's
            # principal (PLAINTEXT: ANONYMOUS) may do everything.
            "super.users": "User:eo-broker;User:ANONYMOUS",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        },
    )
    info = kafka.up(timeout_s=180)
    try:
        yield AclBroker(bootstrap=info.bootstrap, ca=ca.cert, passwords=passwords)
    finally:
        close_shared_clients()
        close_producers()
        kafka.wipe()


@pytest.fixture(scope="module")
def kafka_bootstrap(acl_broker: AclBroker) -> str:
    """This module's broker instead of the session's plaintext one."""
    return acl_broker.bootstrap


@pytest.fixture(scope="module")
def kafka_config(acl_broker: AclBroker) -> dict[str, Any]:
    """The super user's settings (``make_topic`` creates topics with them)."""
    return acl_broker.config("eo-broker")


def _principal_acls(acl_broker: AclBroker, principal: str) -> set[tuple[Any, ...]]:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    flt = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    client = admin.admin_client(acl_broker.config("eo-broker"))
    found = client.describe_acls(flt, request_timeout=15).result(timeout=30)
    return {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in found}


def _binding_key(b: Any) -> tuple[Any, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.operation)


def set_acls(acl_broker: AclBroker, entries: list[AclEntry]) -> None:
    """Make the ACLs of ``entries``' principals exactly ``entries`` (others deleted), and
    wait until the broker's authorizer shows them."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    client = admin.admin_client(acl_broker.config("eo-broker"))
    principals = {e.principal for e in entries}
    want = {
        p: {_binding_key(b) for b in acl_bindings([e for e in entries if e.principal == p])}
        for p in principals
    }
    filters = [
        AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, p, None, AclOperation.ANY, AclPermissionType.ANY
        )
        for p in principals
    ]
    for fut in client.delete_acls(filters, request_timeout=15).values():
        fut.result(timeout=30)
    bindings = acl_bindings(entries)
    if bindings:
        for fut in client.create_acls(bindings, request_timeout=15).values():
            fut.result(timeout=30)
    wait_for(
        lambda: all(_principal_acls(acl_broker, p) == want[p] for p in principals),
        "the broker to show the ACLs",
        timeout=30,
    )


def produce(config: dict[str, Any], topic: str, n: int, *, poison_at: int | None = None) -> None:
    producer = Producer({**config, "linger.ms": 5})
    for i in range(n):
        value = b"POISON" if i == poison_at else f"k{i % 7}:{i}".encode()
        producer.produce(topic, key=f"k{i % 7}", value=value)
    producer.flush(30)


@pytest.fixture()
def acl_pipeline(
    tmp_path: Path, acl_broker: AclBroker, make_topic: Callable[..., str]
) -> Callable[[str], Pipeline]:
    """A pipeline on fresh topics (a dead-letter topic with a budget), running as ``user``."""

    def _make(user: str) -> Pipeline:
        return Pipeline(
            name=f"acl-{uuid.uuid4().hex[:8]}",
            kafka=acl_broker.config(user),
            source_topics=[make_topic("src", partitions=2)],
            sink_topic=make_topic("sink", partitions=2),
            dead_letter_topic=make_topic("dlq", partitions=1),
            max_dead_letters_per_checkpoint=2,
            transform="eo_test_transforms:poison",
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=str(tmp_path / "staging"),
            commit_mode="local",
        )

    return _make


def as_user(pipeline: Pipeline, acl_broker: AclBroker, user: str) -> Pipeline:
    return replace(pipeline, kafka=acl_broker.config(user))


class DoctorFailed(Exception):
    """The doctor failed a check (its findings' text)."""


def run_roles(
    pipeline: Pipeline, ledger: Ledger, spark: Any, user: Callable[[str], Pipeline] | None = None
) -> None:
    """Every role once, in the order a deployment runs them: plan, prepare, commit (local),
    audit, the source watcher and the UI's lag read, the doctor (no Spark), recover.
    ``user(role)`` gives the role's pipeline (its own principal); default: ``pipeline``."""
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.core.commit import commit_checkpoint
    from airflow_provider_eo.core.doctor import run_doctor
    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.core.recover import recover_pipeline
    from airflow_provider_eo.spark.stager import SparkStager
    from airflow_provider_eo.triggers.source import read_source_ends

    def role(name: str) -> Pipeline:
        return pipeline if user is None else user(name)

    planned = plan_checkpoint(role("planner"), ledger)
    prepare_checkpoint(role("prepare"), ledger, planned.checkpoint_id, stager=SparkStager(spark))
    commit_checkpoint(role("committer"), ledger, planned.checkpoint_id)
    report = audit_pipeline(role("audit"), ledger)
    assert report.ok, report.as_dict()
    ends, _ = read_source_ends(role("watcher"), known={})
    watcher = role("watcher")
    assert admin.list_offsets(watcher.kafka, sorted(ends), spec="latest") == ends  # the UI's lag read
    doctor = run_doctor(role("doctor"), spark=False, list_transactions=False)
    failed = [f"{f.check}: {f.found}" for f in doctor.findings if f.severity == "fail"]
    if failed:
        raise DoctorFailed("; ".join(failed))
    recover_pipeline(role("recover"), ledger, wait_s=5)


def test_each_role_as_its_own_user_and_a_stream_run_exactly_once(
    acl_broker: AclBroker, acl_pipeline: Callable[[str], Pipeline], spark: Any
) -> None:
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.core.stream import run_stream
    from airflow_provider_eo.spark.stager import SparkStager

    admin_config = acl_broker.config("eo-broker")
    # One user per role, each holding exactly its role's ACLs.
    pipeline = acl_pipeline("eo")
    roles = {r: f"User:{r}" for r in ROLE_USERS}
    roles["ui"] = "User:watcher"
    # A stream runs the planner, the prepare and the committer in one process, as one user.
    # Its own pipeline: Spark caches its Kafka consumers by group id and partition, and one
    # group read with two users' settings in one Spark session is refused.
    streamed = acl_pipeline("eo")
    # ... and audited as the audit user, with only its ACLs.
    stream_acls = role_acls(streamed, "User:eo", roles={"audit": "User:audit"})
    granted = [*role_acls(pipeline, "User:eo", roles=roles), *stream_acls]
    set_acls(acl_broker, granted)
    produce(admin_config, pipeline.source_topics[0], 60, poison_at=17)

    with Ledger(pipeline.ledger_url) as ledger:
        run_roles(pipeline, ledger, spark, user=lambda role: as_user(pipeline, acl_broker, role))
        produce(admin_config, streamed.source_topics[0], 40)
        # 10 more records after each of the first two checkpoints; the stream ends once it
        # has committed all 60 (it plans the next checkpoint while the previous one commits,
        # so where the fed records land is not fixed: at least three checkpoints).
        fed: list[int] = []
        committed: list[int] = []
        done = threading.Event()

        def feed(checkpoint: Any) -> None:
            committed.append(int(checkpoint.records or 0))
            if len(fed) < 2:
                produce(admin_config, streamed.source_topics[0], 10)
                fed.append(10)
            elif sum(committed) >= 60:
                done.set()

        result = run_stream(
            streamed,
            interval_s=0.5,
            duration_s=180,
            stop=done,
            ledger=ledger,
            stager=SparkStager(spark),
            on_checkpoint=feed,
        )
        assert sum(committed) == 60 and len(result.checkpoints) >= 3, result.summary()
        assert not result.unfinished, result.summary()
        stream_audit = audit_pipeline(as_user(streamed, acl_broker, "audit"), ledger)
        assert stream_audit.ok and len(stream_audit.checkpoints) == len(result.checkpoints), (
            stream_audit.as_dict()
        )
        # The audit ran as the audit user: its READ on the stream's sink removed, it is refused.
        assert_audit_refused_without_sink_read(acl_broker, granted, streamed, ledger)

    # Counted against the source: the poison record in the dead-letter topic, every other
    # source record once in the sink, nothing else there.
    report = compare_source_and_sink(
        admin_config, list(pipeline.source_topics), pipeline.sink_topic, pipeline.name
    )
    assert report.source == 60, report.describe()
    assert len(report.missing) == 1 and report.sink == 59, report.describe()
    assert not (report.duplicated or report.unexpected or report.unattributed), report.describe()
    dead = read_sink(admin_config, pipeline.dead_letter_topic or "")  # read_committed
    assert [m.value() for m in dead] == [b"POISON"], dead
    stream_report = compare_source_and_sink(
        admin_config, list(streamed.source_topics), streamed.sink_topic, streamed.name
    )
    assert stream_report.exactly_once and stream_report.source == 60, stream_report.describe()


def assert_refusal_names(text: str, removed: AclEntry) -> None:
    """``text`` is a :class:`KafkaAccessDenied` naming ``removed`` and the command granting it
    (READ and WRITE imply DESCRIBE: without them, the first call refused may be one that
    needed only DESCRIBE on that resource, and its error names DESCRIBE)."""
    assert "KafkaAccessDenied" in text or "the broker's ACLs refused" in text, text
    named = {removed.operation} | ({"DESCRIBE"} if removed.operation in ("READ", "WRITE") else set())
    assert any(f"{op} on {removed.resource_type}" in text for op in named), text
    assert removed.resource in text and removed.principal in text, text
    assert "kafka-acls" in text, text


def assert_audit_refused_without_sink_read(
    acl_broker: AclBroker, granted: list[AclEntry], pipeline: Pipeline, ledger: Ledger
) -> None:
    """The audit of ``pipeline`` as the audit user, its READ on the sink taken from
    ``granted``: refused within seconds, the error naming that ACL."""
    from airflow_provider_eo.core.audit import audit_pipeline

    removed = next(
        e
        for e in granted
        if e.role == "audit"
        and e.key[1:] == ("topic", pipeline.sink_topic, "literal", "READ")
        and e.principal == "User:audit"
    )
    set_acls(acl_broker, [e for e in granted if e is not removed])
    started = time.monotonic()
    with pytest.raises(KafkaAccessDenied) as caught:
        audit_pipeline(as_user(pipeline, acl_broker, "audit"), ledger)
    took = time.monotonic() - started
    assert_refusal_names(str(caught.value), removed)
    assert took < REFUSAL_S, f"the audit's refusal took {took:.0f} s: {caught.value}"
    set_acls(acl_broker, granted)


def _single_principal_cases() -> list[Any]:
    template = Pipeline(
        name="P",
        kafka={"bootstrap.servers": "-"},
        source_topics=["SRC"],
        sink_topic="SINK",
        dead_letter_topic="DLQ",
        max_dead_letters_per_checkpoint=2,
    )
    return [
        pytest.param(i, id=f"{e.operation}-{e.resource_type}-{e.resource}")
        for i, e in enumerate(pipeline_acls(template, "User:eo"))
    ]


@pytest.mark.parametrize("index", _single_principal_cases())
def test_each_acl_removed_fails_at_once_naming_it(
    index: int, acl_broker: AclBroker, acl_pipeline: Callable[[str], Pipeline], spark: Any
) -> None:
    pipeline = acl_pipeline("eo")
    entries = pipeline_acls(pipeline, "User:eo")
    removed = entries[index]
    set_acls(acl_broker, [e for i, e in enumerate(entries) if i != index])
    # A poison record (its dead letter) only where the removed ACL is the dead-letter
    # topic's: elsewhere its search (a few Spark jobs) is time spent before the refusal.
    dead_letters = removed.resource == pipeline.dead_letter_topic
    produce(
        acl_broker.config("eo-broker"), pipeline.source_topics[0], 30, poison_at=5 if dead_letters else None
    )

    started = time.monotonic()
    with Ledger(pipeline.ledger_url) as ledger:
        if not removed.required:  # recommended only: every role still runs
            run_roles(pipeline, ledger, spark)
            return
        with pytest.raises((EoError, DoctorFailed)) as caught:
            run_roles(pipeline, ledger, spark)
    took = time.monotonic() - started
    text = str(caught.value)
    assert isinstance(caught.value, KafkaAccessDenied) or "KafkaAccessDenied" in text, (
        f"{type(caught.value).__name__}: {text}"
    )
    # READ and WRITE imply DESCRIBE: without them, the first role to fail may be one that
    # needed only DESCRIBE on that resource, and its error names DESCRIBE.
    named = {removed.operation} | ({"DESCRIBE"} if removed.operation in ("READ", "WRITE") else set())
    assert any(f"{op} on {removed.resource_type}" in text for op in named), text
    assert removed.resource in text, text
    assert "kafka-acls" in text, text
    assert took < REFUSAL_S, f"the refusal took {took:.0f} s: {text}"
    if removed.resource == names.marker_group(pipeline):
        assert took < MARKER_REFUSAL_S, f"the marker group's refusal took {took:.0f} s: {text}"


# -- the Structured Streaming sink ------------------------------------------------------------

#: How long the query of a few small batches may take (it ends on its own: availableNow).
QUERY_S = 240.0
#: Records per micro-batch (``maxOffsetsPerTrigger``): 30 source records make 3 batches.
BATCH_RECORDS = 10


@dataclass(frozen=True)
class SinkQuery:
    """A ``KafkaExactlyOnceSink`` (as the ``sink`` user) on fresh topics, its pipeline (the
    query's source known: what ``as_pipeline()`` gives after a batch) and its query's
    checkpoint location."""

    sink: Any
    pipeline: Pipeline
    location: str


@pytest.fixture()
def sink_query(tmp_path: Path, acl_broker: AclBroker, make_topic: Callable[..., str]) -> Iterator[SinkQuery]:
    from airflow_provider_eo.streaming import KafkaExactlyOnceSink

    source = make_topic("ss-src", partitions=2)
    sink = KafkaExactlyOnceSink(
        name=f"acl-ss-{uuid.uuid4().hex[:8]}",
        kafka=acl_broker.config("sink"),
        sink_topic=make_topic("ss-out", partitions=2),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        commit_mode="local",
        heartbeat_s=1.0,
    )
    yield SinkQuery(sink, replace(sink.base_pipeline(), source_topics=(source,)), str(tmp_path / "ckpt"))
    sink.close()


def run_query(
    spark: Any, acl_broker: AclBroker, q: SinkQuery, **options: str
) -> tuple[BaseException | None, float]:
    """The user's query, as the ``query`` user: Spark's own Kafka source (its default group
    ids: no ``groupIdPrefix``, no ``kafka.group.id``), records passed through with their
    source position (so the sink is counted against the source by position), written through
    the sink, ``availableNow``; ``options``: more options of the source. Its failure (None
    when it finished) and how long it ran."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    from airflow_provider_eo.kafka.client_config import java_client_options
    from airflow_provider_eo.spark.source import PROVENANCE_COLUMN

    frame = (
        spark.readStream.format("kafka")
        .options(**java_client_options(acl_broker.config("query"), owner="the query"))
        .option("subscribe", q.pipeline.source_topics[0])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(BATCH_RECORDS))
        .options(**options)
        .load()
        .select("key", "value", F.struct("topic", "partition", "offset").alias(PROVENANCE_COLUMN))
    )
    started = time.monotonic()
    query = q.sink.start(frame, q.location, output_mode="append", available_now=True)
    try:
        finished = query.awaitTermination(QUERY_S)
    except StreamingQueryException as exc:
        return exc, time.monotonic() - started
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"the query did not end within {QUERY_S:.0f} s"
    return None, time.monotonic() - started


#: The principal of each role of the sink's pipeline in these tests.
SINK_ROLES = {"query": "User:query", "sink": "User:sink", "audit": "User:audit", "ui": "User:watcher"}


def test_structured_streaming_sink_with_exactly_its_acls_runs_exactly_once(
    acl_broker: AclBroker, sink_query: SinkQuery, spark: Any
) -> None:
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.ledger import CheckpointState

    admin_config = acl_broker.config("eo-broker")
    pipeline = sink_query.pipeline
    granted = role_acls(pipeline, "User:eo", roles=SINK_ROLES, structured_streaming=True)
    assert {e.role for e in granted} >= {"query", "sink", "audit", "ui"}, granted
    set_acls(acl_broker, granted)
    produce(admin_config, pipeline.source_topics[0], 3 * BATCH_RECORDS)

    failure, took = run_query(spark, acl_broker, sink_query)
    assert failure is None, failure
    assert sink_query.sink.as_pipeline().source_topics == pipeline.source_topics

    # Counted against the source: every source record once in the sink, nothing else there.
    report = compare_source_and_sink(
        admin_config, list(pipeline.source_topics), pipeline.sink_topic, pipeline.name
    )
    assert report.exactly_once and report.source == 3 * BATCH_RECORDS, report.describe()
    with Ledger(pipeline.ledger_url) as ledger:
        committed = [
            c for c in ledger.list_checkpoints(pipeline.name) if c.state is CheckpointState.COMMITTED
        ]
        assert len(committed) >= 3, committed  # a few batches, each its own checkpoint
        audit = audit_pipeline(as_user(pipeline, acl_broker, "audit"), ledger)
        assert audit.ok and len(audit.checkpoints) == len(committed), audit.as_dict()
        # The UI's lag read, as the UI's user: the source's ends, where the last batch ended.
        last = max(committed, key=lambda c: c.checkpoint_id)
        ui = as_user(pipeline, acl_broker, "watcher")
        assert admin.list_offsets(ui.kafka, [r.key for r in last.ranges], spec="latest") == {
            r.key: r.end for r in last.ranges
        }
        # The audit ran as the audit user: its READ on the sink removed, it is refused.
        assert_audit_refused_without_sink_read(acl_broker, granted, pipeline, ledger)
    print(f"the query of {len(committed)} batches took {took:.1f} s")


def _sink_removal_cases() -> list[Any]:
    return [
        pytest.param("READ", "topic", "source", id="READ-topic-source"),
        pytest.param("READ", "group", "group", id="READ-group-pipeline-group"),
    ]


@pytest.mark.parametrize(("operation", "kind", "which"), _sink_removal_cases())
def test_structured_streaming_sink_acl_removed_fails_the_query_at_once_naming_it(
    operation: str, kind: str, which: str, acl_broker: AclBroker, sink_query: SinkQuery, spark: Any
) -> None:
    """The sink's READ on the source topic (the batch's offsets move on the source partitions)
    or on the pipeline's group (the offsets it moves) removed: the query fails within
    seconds, its error naming the ACL (not a hang, not a retry loop)."""
    pipeline = sink_query.pipeline
    resource = pipeline.source_topics[0] if which == "source" else pipeline.group_id
    granted = role_acls(pipeline, "User:eo", roles=SINK_ROLES, structured_streaming=True)
    removed = next(
        e for e in granted if e.role == "sink" and e.key[1:] == (kind, resource, "literal", operation)
    )
    set_acls(acl_broker, [e for e in granted if e is not removed])
    produce(acl_broker.config("eo-broker"), pipeline.source_topics[0], BATCH_RECORDS)

    failure, took = run_query(spark, acl_broker, sink_query)
    assert failure is not None, "the query ran without the sink's ACL"
    assert_refusal_names(str(failure), removed)
    assert took < REFUSAL_S, f"the refusal took {took:.0f} s: {failure}"
    print(f"{removed.describe()} removed: the query failed after {took:.1f} s")
    # Nothing published: what a read_committed consumer sees now (the refused batch's
    # transaction may stay open until the broker's timeout: nothing to wait for).
    assert read_sink(acl_broker.config("eo-broker"), pipeline.sink_topic, settle_s=0) == []


def test_a_query_whose_driver_subscribes_needs_read_on_its_group_prefix(
    acl_broker: AclBroker, sink_query: SinkQuery, spark: Any
) -> None:
    """With ``spark.sql.streaming.kafka.useDeprecatedOffsetFetching=true`` the query's driver
    reads offsets with a consumer that subscribes, so it joins its group
    (``<groupIdPrefix>-...-driver-<n>``): refused without READ on that group (Spark's error
    names it), and exactly once with READ on the ``groupIdPrefix`` the query sets, granted
    as a prefixed ACL (docs/kafka-acls.md)."""
    pipeline = sink_query.pipeline
    prefix = f"eo-query.{pipeline.name}"
    granted = role_acls(pipeline, "User:eo", roles=SINK_ROLES, structured_streaming=True)
    group_read = AclEntry("query", "User:query", "group", prefix, "prefixed", "READ", "the driver's group")
    set_acls(acl_broker, granted)
    produce(acl_broker.config("eo-broker"), pipeline.source_topics[0], BATCH_RECORDS)
    key = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"
    trace = "spark.sql.pyspark.jvmStacktrace.enabled"  # the Kafka error is in the JVM's trace
    spark.conf.set(key, "true")
    spark.conf.set(trace, "true")
    try:
        failure, took = run_query(spark, acl_broker, sink_query, groupIdPrefix=prefix)
        assert failure is not None, "the subscribing driver needed no group ACL"
        text = str(failure)
        assert f"GroupAuthorizationException: Not authorized to access group: {prefix}-" in text, text
        assert took < REFUSAL_S, f"the refusal took {took:.0f} s"
        print(f"without READ on the group prefix: refused after {took:.1f} s")
        set_acls(acl_broker, [*granted, group_read])
        failure, took = run_query(spark, acl_broker, sink_query, groupIdPrefix=prefix)
        assert failure is None, failure
    finally:
        spark.conf.unset(key)
        spark.conf.unset(trace)
    report = compare_source_and_sink(
        acl_broker.config("eo-broker"), list(pipeline.source_topics), pipeline.sink_topic, pipeline.name
    )
    assert report.exactly_once and report.source == BATCH_RECORDS, report.describe()
