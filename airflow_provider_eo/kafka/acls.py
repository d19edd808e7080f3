"""The Kafka ACLs a pipeline needs, per role, and the error an ACL refusal raises.

:func:`pipeline_acls` is the one list (``docs/kafka-acls.md`` is its table, ``eo doctor
--acls`` prints it as ``kafka-acls.sh`` commands, the authorizer tests grant exactly it).
Each entry was found by running that role against a broker with ``StandardAuthorizer``
and reading what the authorizer checked, then removing the entry and watching the role
fail. :func:`access_denied` turns a refusal (librdkafka's ``*_AUTHORIZATION_FAILED``, the
Java client's ``*AuthorizationException``) into a :class:`KafkaAccessDenied` that names
the operation and the resource and says how to grant it: a refusal is the environment's
fault, never retried and never blamed on a record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from airflow_provider_eo import names
from airflow_provider_eo.errors import ConfigError, KafkaAccessDenied
from airflow_provider_eo.pipeline import Pipeline

_Denied = TypeVar("_Denied", bound=KafkaAccessDenied)
ResourceKind = Literal["topic", "group", "transactional-id", "cluster"]
PatternKind = Literal["literal", "prefixed"]

#: The roles, in the order the table lists them.
ROLES: tuple[str, ...] = ("planner", "prepare", "committer", "audit", "watcher", "ui", "doctor", "recover")
#: The roles of a Structured Streaming sink's pipeline (``KafkaExactlyOnceSink``): the user's
#: ``query`` reads the source with Spark's Kafka source, the ``sink`` records, stages and
#: commits each micro-batch (it plans nothing and reads no source record); no source watcher.
QUERY_ROLES: tuple[str, ...] = ("query", "sink", "audit", "ui", "doctor", "recover")
#: Roles that only an operator runs by hand; their ACLs are printed only when asked.
OPTIONAL_ROLES: tuple[str, ...] = ("operator",)

#: kafka-acls.sh's spelling of each operation.
_CLI_OPERATION = {
    "READ": "Read",
    "WRITE": "Write",
    "DESCRIBE": "Describe",
    "DESCRIBE_CONFIGS": "DescribeConfigs",
    "ALTER": "Alter",
    "IDEMPOTENT_WRITE": "IdempotentWrite",
}
_CLI_RESOURCE = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}

#: The random-suffixed groups of eo's own short-lived consumers (assign() only, never
#: joined, never committed): librdkafka looks their coordinator up all the same.
READER_GROUP_PREFIX = "eo-read."


@dataclass(frozen=True)
class AclEntry:
    """One ALLOW ACL: ``principal`` may ``operation`` on the resource."""

    role: str
    principal: str
    resource_type: ResourceKind
    resource: str
    pattern: PatternKind
    operation: str
    why: str
    #: False for a recommended ACL: without it the role still runs (a setting stands in,
    #: or the doctor reports the value as unknown).
    required: bool = True

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What makes two entries the same ACL (the role and the reason aside)."""
        return (self.principal, self.resource_type, self.resource, self.pattern, self.operation)

    def describe(self) -> str:
        """``READ on topic 'orders'`` (``prefixed`` named)."""
        pattern = " (prefixed)" if self.pattern == "prefixed" else ""
        name = "" if self.resource_type == "cluster" else f" {self.resource!r}"
        return f"{self.operation} on {self.resource_type}{name}{pattern}"


def reader_group(pipeline: Pipeline) -> str:
    """The group id Spark's Kafka source reads a pipeline's sources with (never joined)."""
    return READER_GROUP_PREFIX + pipeline.name


#: Operations another operation on the same resource implies (Kafka's ACL semantics):
#: READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS.
_IMPLIED_BY = {"DESCRIBE": ("READ", "WRITE", "ALTER"), "DESCRIBE_CONFIGS": ("ALTER_CONFIGS",)}


def pipeline_acls(
    pipeline: Pipeline,
    principal: str = "User:eo",
    *,
    roles: Mapping[str, str] | None = None,
    operator: bool = False,
    structured_streaming: bool = False,
) -> list[AclEntry]:
    """The least ALLOW ACLs ``pipeline``'s principals need: :func:`role_acls` with the
    entries a principal holds twice, or that another of its entries implies, dropped."""
    return minimal(
        role_acls(
            pipeline, principal, roles=roles, operator=operator, structured_streaming=structured_streaming
        )
    )


def role_acls(
    pipeline: Pipeline,
    principal: str = "User:eo",
    *,
    roles: Mapping[str, str] | None = None,
    operator: bool = False,
    structured_streaming: bool = False,
) -> list[AclEntry]:
    """Every ALLOW ACL ``pipeline`` needs, role by role (``docs/kafka-acls.md`` is this
    list as a table).

    :param principal: the principal every role runs as, unless ``roles`` names another.
    :param roles: role -> principal overrides (roles: :data:`ROLES`, :data:`QUERY_ROLES`,
        ``operator``).
    :param operator: also the optional ``operator`` role (``eo recover --abort-hanging``
        ending a hanging transaction no coordinator holds: Kafka's ``WriteTxnMarkers``).
    :param structured_streaming: ``pipeline`` is a Structured Streaming sink's
        (:meth:`KafkaExactlyOnceSink.as_pipeline`): the roles of :data:`QUERY_ROLES` (the
        ``query`` and the ``sink`` in place of the planner, the prepare, the committer and
        the source watcher).

    Each entry is required by its role (the authorizer tests remove each in turn), but the
    ``DESCRIBE_CONFIGS`` ones (``required=False``), which are recommended: without them the
    pipeline's ``sink_max_message_bytes`` stands in for the topic's ``max.message.bytes`` and
    the doctor reports the brokers' transaction time-out as unknown.
    """
    overrides = dict(roles or {})
    who = {
        role: _checked_principal(overrides.get(role, principal))
        for role in dict.fromkeys((*ROLES, *QUERY_ROLES, *OPTIONAL_ROLES))
    }
    sources = list(dict.fromkeys(pipeline.source_topics))
    sink = pipeline.sink_topic
    dlq = pipeline.dead_letter_topic if pipeline.dead_letters_enabled else None
    txn_prefix = f"{pipeline.transactional_id_prefix}.{pipeline.name}."
    group = pipeline.group_id
    markers = names.marker_group(pipeline)
    out: list[AclEntry] = []

    def add(
        role: str,
        kind: ResourceKind,
        resource: str,
        operation: str,
        why: str,
        pattern: PatternKind = "literal",
        *,
        required: bool = True,
    ) -> None:
        out.append(AclEntry(role, who[role], kind, resource, pattern, operation, why, required))

    if structured_streaming:
        for topic in sources:
            add(
                "query",
                "topic",
                topic,
                "READ",
                "Spark's Kafka source: the driver lists offsets (AdminClient: Metadata, ListOffsets), "
                "the executors fetch (assign only: their group is never joined)",
            )
        for topic in sources:
            add(
                "sink",
                "topic",
                topic,
                "DESCRIBE",
                "the earliest offset of a partition new to the query (ListOffsets)",
            )
        add(
            "sink",
            "topic",
            sink,
            "DESCRIBE",
            "the sink's partitions for each batch's commit plan and staging",
        )
        add("sink", "group", markers, "DESCRIBE", "the commit markers, checked before a batch is recorded")
    else:
        for topic in sources:
            add(
                "planner",
                "topic",
                topic,
                "DESCRIBE",
                "partitions (Metadata) and offsets (ListOffsets) to plan a checkpoint",
            )
        add("planner", "topic", sink, "DESCRIBE", "the sink's partitions and offsets for the commit plan")
        add(
            "planner", "group", group, "DESCRIBE", "the pipeline group's offsets (startup=group; OffsetFetch)"
        )
        add("planner", "group", markers, "DESCRIBE", "the commit markers (OffsetFetch)")

        for topic in sources:
            add(
                "prepare",
                "topic",
                topic,
                "READ",
                "Spark's Java consumer reads the planned ranges (Fetch, ListOffsets); the driver a small "
                "checkpoint's (Fetch)",
            )
        add(
            "prepare",
            "topic",
            sink,
            "DESCRIBE",
            "the sink's partitions (the output is partitioned like the sink)",
        )
        add(
            "prepare",
            "topic",
            sink,
            "DESCRIBE_CONFIGS",
            "recommended: the sink's max.message.bytes for the size check (else sink_max_message_bytes)",
            required=False,
        )
        if dlq:
            add("prepare", "topic", dlq, "DESCRIBE", "the dead-letter topic's partitions")

    committer = "sink" if structured_streaming else "committer"
    add(
        committer,
        "transactional-id",
        txn_prefix,
        "WRITE",
        "the shards' transactional ids (InitProducerId, Produce, EndTxn)",
        "prefixed",
    )
    add(committer, "topic", sink, "WRITE", "publish the checkpoint's output in the shards' transactions")
    add(
        committer,
        "topic",
        sink,
        "READ",
        "commit markers are offsets on the sink's partitions (TxnOffsetCommit); read-back",
    )
    for topic in sources:
        add(
            committer,
            "topic",
            topic,
            "READ",
            "the pipeline group's offsets move on the source partitions (TxnOffsetCommit)",
        )
    if dlq:
        add(committer, "topic", dlq, "WRITE", "publish the checkpoint's dead letters in its transaction")
    add(
        committer,
        "group",
        group,
        "READ",
        "send_offsets_to_transaction moves the pipeline group (AddOffsetsToTxn)",
    )
    add(
        committer,
        "group",
        markers,
        "READ",
        "the commit marker is a transactional offset commit of this group",
    )

    add(
        committer,
        "group",
        "eo-readback-",
        "DESCRIBE",
        "the read-back after a crash (a marker missing): its reader's coordinator look-up",
        "prefixed",
        required=False,
    )
    add(
        committer,
        "topic",
        sink,
        "DESCRIBE_CONFIGS",
        "recommended: the sink's max.message.bytes bounds the batches (else sink_max_message_bytes)",
        required=False,
    )

    add("audit", "topic", sink, "READ", "read the sink with read_committed")
    for topic in sources:
        add("audit", "topic", topic, "READ", "count the source records each checkpoint read")
    if dlq:
        add("audit", "topic", dlq, "READ", "count the dead letters")
    add("audit", "group", group, "DESCRIBE", "the pipeline group's offsets against the ledger")
    for prefix in AUDIT_GROUP_PREFIXES:
        add(
            "audit",
            "group",
            prefix,
            "DESCRIBE",
            "the audit's own consumers (assign only, never joined)",
            "prefixed",
        )

    for topic in sources:
        if not structured_streaming:  # a query is started by its own trigger, not on new data
            add(
                "watcher",
                "topic",
                topic,
                "DESCRIBE",
                "the source watcher compares the source's ends with the ledger (ListOffsets)",
            )
        add("ui", "topic", topic, "DESCRIBE", "the UI's lag column reads the source's ends (ListOffsets)")

    for topic in [*sources, sink]:
        add("doctor", "topic", topic, "DESCRIBE", "partitions and leaders of the pipeline's topics")
    add("doctor", "group", markers, "DESCRIBE", "the marker group's members and offsets")
    add("doctor", "topic", sink, "READ", "the transactions check: producers on the sink (DescribeProducers)")
    add(
        "doctor",
        "transactional-id",
        txn_prefix,
        "DESCRIBE",
        "the transactions check: ListTransactions shows only ids the principal may describe",
        "prefixed",
    )
    add(
        "doctor",
        "cluster",
        "kafka-cluster",
        "DESCRIBE_CONFIGS",
        "recommended: the brokers' transaction.max.timeout.ms (else reported unknown)",
        required=False,
    )

    # `eo recover` fences the ids and commits a PREPARED checkpoint by the markers: it is a
    # committer; with --abort-hanging it also lists the sink's producers.
    for e in [e for e in out if e.role == committer]:
        add("recover", e.resource_type, e.resource, e.operation, e.why, e.pattern)
    add("recover", "topic", sink, "READ", "--abort-hanging: the sink's producers (DescribeProducers)")
    add(
        "recover",
        "transactional-id",
        txn_prefix,
        "DESCRIBE",
        "--abort-hanging: list and describe the pipeline's transactions",
        "prefixed",
    )

    if operator:
        add(
            "operator",
            "cluster",
            "kafka-cluster",
            "ALTER",
            "--abort-hanging: end a hanging transaction no coordinator holds (WriteTxnMarkers; "
            "Kafka 3.8+, KIP-1037; older brokers want CLUSTER_ACTION)",
        )
    return out


#: Group-id prefixes of the audit's short-lived consumers that consume (``eo-audit-`` and
#: ``eo-audit-source-``): librdkafka looks their coordinator up and reports a refusal. The
#: high-watermark readers (``eo-hw-``) only ask for watermarks and need no group ACL.
AUDIT_GROUP_PREFIXES: tuple[str, ...] = ("eo-audit-",)


def minimal(entries: Iterable[AclEntry]) -> list[AclEntry]:
    """``entries`` without repeats and without those another entry of the same principal
    implies (first occurrence kept, order kept)."""
    entries = list(entries)  # read twice
    held = {e.key for e in entries}
    seen: set[tuple[str, str, str, str, str]] = set()
    out: list[AclEntry] = []
    for e in entries:
        implied = any(
            (e.principal, e.resource_type, e.resource, e.pattern, by) in held
            for by in _IMPLIED_BY.get(e.operation, ())
        )
        if e.key in seen or implied:
            continue
        seen.add(e.key)
        out.append(e)
    return out


def parse_role_principals(pairs: Iterable[str]) -> dict[str, str]:
    """``["committer=User:eo-commit", ...]`` -> ``{"committer": "User:eo-commit"}``; an
    unknown role or a principal without its type (``User:``) is refused."""
    out: dict[str, str] = {}
    for pair in pairs:
        role, sep, principal = pair.partition("=")
        role = role.strip()
        known = tuple(dict.fromkeys((*ROLES, *QUERY_ROLES, *OPTIONAL_ROLES)))
        if not sep or role not in known:
            raise ConfigError(
                f"--role-principal {pair!r}: give ROLE=PRINCIPAL with ROLE one of {', '.join(known)}"
            )
        out[role] = _checked_principal(principal.strip())
    return out


def _checked_principal(principal: str) -> str:
    if not re.fullmatch(r"[A-Za-z]+:\S+", principal):
        raise ConfigError(f"principal {principal!r} needs its type, e.g. User:{principal or 'eo'}")
    return principal


def kafka_acls_commands(entries: Sequence[AclEntry], *, bootstrap: str) -> list[str]:
    """``entries`` as ``kafka-acls.sh --add`` commands: one per principal and resource (its
    operations as repeated ``--operation``), each block headed by a ``# role: why`` comment."""
    lines: list[str] = []
    grouped: dict[tuple[str, str, str, str, str], list[AclEntry]] = {}
    for e in entries:
        grouped.setdefault((e.role, e.principal, e.resource_type, e.resource, e.pattern), []).append(e)
    last_role = None
    for (role, principal, kind, resource, pattern), group in grouped.items():
        if role != last_role:
            if lines:
                lines.append("")
            lines.append(f"# {role}")
            last_role = role
        ops = []
        for e in group:
            if _CLI_OPERATION[e.operation] not in ops:
                ops.append(_CLI_OPERATION[e.operation])
        why = "; ".join(dict.fromkeys(e.why for e in group))
        target = "--cluster" if kind == "cluster" else f"{_CLI_RESOURCE[kind]} {_quote(resource)}"
        prefixed = " --resource-pattern-type prefixed" if pattern == "prefixed" else ""
        lines.append(f"# {why}")
        lines.append(
            f"kafka-acls.sh --bootstrap-server {_quote(bootstrap)} --add --allow-principal "
            f"{_quote(principal)} " + " ".join(f"--operation {op}" for op in ops) + f" {target}{prefixed}"
        )
    return lines


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def acl_bindings(entries: Iterable[AclEntry]) -> list[Any]:
    """``entries`` as confluent-kafka ``AclBinding`` s for ``AdminClient.create_acls`` /
    ``delete_acls`` (duplicates dropped)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional-id": ResourceType.TRANSACTIONAL_ID,
        "cluster": ResourceType.BROKER,
    }
    out: dict[tuple[str, str, str, str, str], Any] = {}
    for e in entries:
        out.setdefault(
            e.key,
            AclBinding(
                kinds[e.resource_type],
                e.resource,
                ResourcePatternType.PREFIXED if e.pattern == "prefixed" else ResourcePatternType.LITERAL,
                e.principal,
                "*",
                AclOperation[e.operation],
                AclPermissionType.ALLOW,
            ),
        )
    return list(out.values())


def principal_of(config: Mapping[str, Any] | None) -> str:
    """The principal a client config logs in as, as ACLs spell it (``User:<sasl.username>``),
    or ``User:<principal>`` when the config does not say (mTLS, OAUTHBEARER, Kerberos)."""
    user = (config or {}).get("sasl.username")
    return f"User:{user}" if user else "User:<principal>"


def grant_command(
    operation: str,
    resource_type: ResourceKind,
    resource: str,
    *,
    config: Mapping[str, Any] | None = None,
    pattern: PatternKind = "literal",
) -> str:
    """The ``kafka-acls.sh --add`` command granting one operation to ``config``'s principal."""
    entry = AclEntry("", principal_of(config), resource_type, resource, pattern, operation, "")
    bootstrap = str((config or {}).get("bootstrap.servers") or "<bootstrap>")
    return kafka_acls_commands([entry], bootstrap=bootstrap)[-1]


def access_denied(
    where: str,
    operation: str,
    resource_type: ResourceKind,
    resource: str,
    *,
    config: Mapping[str, Any] | None = None,
    cause: str = "",
    pattern: PatternKind = "literal",
    error: type[_Denied] = KafkaAccessDenied,  # type: ignore[assignment]
) -> _Denied:
    """The error for an ACL refusal: names the operation and the resource, says nothing is
    retried and gives the command that grants it."""
    name = "the cluster" if resource_type == "cluster" else f"{resource_type} {resource!r}"
    exc = error(
        f"{where}: the broker's ACLs refused {principal_of(config)} {operation} on {name}"
        f"{f' ({cause})' if cause else ''}. Not retried: an ACL is missing. Grant it: "
        f"{grant_command(operation, resource_type, resource, config=config, pattern=pattern)} "
        "(`eo doctor --acls` prints every ACL the pipeline needs)."
    )
    exc.operation, exc.resource_type, exc.resource = operation, resource_type, resource
    return exc


#: librdkafka's authorization error codes, by name (``KafkaError.name()``).
AUTHORIZATION_ERRORS = frozenset(
    {
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
    }
)


def is_authorization_error(err: Any) -> bool:
    """Whether a librdkafka ``KafkaError`` is an ACL refusal."""
    try:
        return str(err.name()) in AUTHORIZATION_ERRORS
    except AttributeError:
        return False


# The Java client's refusals, as Spark's job errors carry them.
_JAVA_TOPIC = re.compile(r"TopicAuthorizationException: Not authorized to access topics: \[([^\]]*)\]")
_JAVA_GROUP = re.compile(r"GroupAuthorizationException: Not authorized to access group: (\S+)")
_JAVA_TXN = re.compile(r"TransactionalIdAuthorizationException")
_JAVA_CLUSTER = re.compile(r"ClusterAuthorizationException")


def java_access_denied(
    text: str, where: str, *, topic_operation: str = "READ", config: Mapping[str, Any] | None = None
) -> KafkaAccessDenied | None:
    """The :class:`KafkaAccessDenied` for a Java client's authorization exception found in
    ``text`` (a Spark job's error), or ``None`` when there is none. A topic refusal is
    ``topic_operation`` (the Java client does not say which one: ``READ`` for a fetch)."""
    found = _JAVA_TOPIC.search(text)
    if found:
        topic = found.group(1).split(",")[0].strip()
        return access_denied(
            where, topic_operation, "topic", topic, config=config, cause="TopicAuthorizationException"
        )
    found = _JAVA_GROUP.search(text)
    if found:
        return access_denied(
            where, "READ", "group", found.group(1), config=config, cause="GroupAuthorizationException"
        )
    if _JAVA_TXN.search(text):
        return access_denied(
            where, "WRITE", "transactional-id", "<prefix>", config=config, pattern="prefixed"
        )
    if _JAVA_CLUSTER.search(text):
        return access_denied(where, "IDEMPOTENT_WRITE", "cluster", "kafka-cluster", config=config)
    return None


def reader_denied(
    err: Any, what: str, topic: str, group_prefix: str, config: Mapping[str, Any]
) -> KafkaAccessDenied:
    """The refusal a short-lived reader met (assign only, a random ``group_prefix`` group):
    READ on ``topic``, or DESCRIBE on its group (librdkafka looks the coordinator up)."""
    if str(err.name()) == "GROUP_AUTHORIZATION_FAILED":
        return access_denied(
            what, "DESCRIBE", "group", group_prefix, config=config, cause=err.name(), pattern="prefixed"
        )
    return access_denied(what, "READ", "topic", topic, config=config, cause=err.name())


def commit_denied(
    err: Any,
    what: str,
    *,
    transactional_id: str,
    group: str | None = None,
    topics: Sequence[str] = (),
    produced: Sequence[str] = (),
    unwritable: Callable[[Sequence[str]], str] | None = None,
    config: Mapping[str, Any] | None = None,
    error: type[_Denied] = KafkaAccessDenied,  # type: ignore[assignment]
) -> KafkaAccessDenied:
    """The refusal a transactional call met: WRITE on one of the ``produced`` topics (the
    transaction's AddPartitionsToTxn, reported by the next call), WRITE on the
    transactional id (prefix: every shard's id), READ on ``group``
    (``send_offsets_to_transaction``) or READ on ``topics`` (the offsets' topics,
    TxnOffsetCommit). ``unwritable(produced)`` names the one the broker refuses."""
    from airflow_provider_eo.errors import TransactionalIdUnauthorized

    name = str(err.name())
    if name == "TOPIC_AUTHORIZATION_FAILED" and produced and "add partition" in str(err.str()).lower():
        # AddPartitionsToTxn was refused (the first produce to a partition): WRITE on one of
        # the topics written; librdkafka does not say which, the broker does.
        topic = unwritable(produced) if unwritable is not None else ", ".join(produced)
        return access_denied(what, "WRITE", "topic", topic, config=config, cause=name, error=error)
    if name == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
        prefix = transactional_id.rsplit(".", 1)[0] + "."
        return access_denied(
            what,
            "WRITE",
            "transactional-id",
            prefix,
            config=config,
            cause=name,
            pattern="prefixed",
            error=TransactionalIdUnauthorized,
        )
    if name == "GROUP_AUTHORIZATION_FAILED" and group is not None:
        return access_denied(what, "READ", "group", group, config=config, cause=name, error=error)
    if name == "TOPIC_AUTHORIZATION_FAILED" and topics:
        return access_denied(what, "READ", "topic", ", ".join(topics), config=config, cause=name, error=error)
    return access_denied(what, "WRITE", "cluster", "kafka-cluster", config=config, cause=name, error=error)
