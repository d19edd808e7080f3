"""The ACL list of a pipeline (``pipeline_acls``), its ``kafka-acls.sh`` commands, the error an
ACL refusal becomes, and ``eo doctor --acls``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_provider_eo import cli
from airflow_provider_eo.cli import diagnose
from airflow_provider_eo.errors import ConfigError, KafkaAccessDenied, TransactionalIdUnauthorized
from airflow_provider_eo.kafka import acls
from airflow_provider_eo.pipeline import Pipeline


def _pipeline(tmp_path: Path, **kw: object) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "k1:9092", "sasl.username": "eo"},
        source_topics=["in-a", "in-b"],
        sink_topic="out",
        ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
        **kw,  # type: ignore[arg-type]
    )


def _keys(entries: list[acls.AclEntry]) -> set[tuple[str, str, str, str]]:
    return {(e.resource_type, e.resource, e.pattern, e.operation) for e in entries}


def test_one_principal_gets_the_least_union(tmp_path: Path) -> None:
    entries = acls.pipeline_acls(_pipeline(tmp_path), "User:eo")
    assert {e.principal for e in entries} == {"User:eo"}
    assert _keys(entries) == {
        ("topic", "in-a", "literal", "READ"),
        ("topic", "in-b", "literal", "READ"),
        ("topic", "out", "literal", "READ"),
        ("topic", "out", "literal", "WRITE"),
        ("topic", "out", "literal", "DESCRIBE_CONFIGS"),
        ("group", "eo.orders", "literal", "READ"),
        ("group", "eo-marker.orders", "literal", "READ"),
        ("transactional-id", "eo.orders.", "prefixed", "WRITE"),
        ("group", "eo-audit-", "prefixed", "DESCRIBE"),
        ("group", "eo-readback-", "prefixed", "DESCRIBE"),
        ("cluster", "kafka-cluster", "literal", "DESCRIBE_CONFIGS"),
    }
    # No DESCRIBE where the same principal holds READ or WRITE (Kafka implies it).
    assert len(entries) == len({e.key for e in entries})


def test_names_follow_the_pipeline(tmp_path: Path) -> None:
    pipeline = _pipeline(
        tmp_path,
        transactional_id_prefix="team",
        consumer_group="orders-lag",
        dead_letter_topic="dlq",
        max_dead_letters_per_checkpoint=3,
    )
    keys = _keys(acls.pipeline_acls(pipeline))
    assert ("transactional-id", "team.orders.", "prefixed", "WRITE") in keys
    assert ("group", "orders-lag", "literal", "READ") in keys
    assert {("topic", "dlq", "literal", "WRITE"), ("topic", "dlq", "literal", "READ")} <= keys
    # A dead-letter topic without a budget is never written: no ACL for it.
    no_budget = _keys(acls.pipeline_acls(_pipeline(tmp_path, dead_letter_topic="dlq")))
    assert not any(k[1] == "dlq" for k in no_budget)


def test_role_principals_keep_each_roles_own_entries(tmp_path: Path) -> None:
    entries = acls.pipeline_acls(
        _pipeline(tmp_path), "User:eo", roles={"planner": "User:plan", "audit": "User:audit"}
    )
    planner = _keys([e for e in entries if e.principal == "User:plan"])
    assert planner == {
        ("topic", "in-a", "literal", "DESCRIBE"),
        ("topic", "in-b", "literal", "DESCRIBE"),
        ("topic", "out", "literal", "DESCRIBE"),
        ("group", "eo.orders", "literal", "DESCRIBE"),
        ("group", "eo-marker.orders", "literal", "DESCRIBE"),
    }
    audit = _keys([e for e in entries if e.principal == "User:audit"])
    assert ("topic", "out", "literal", "READ") in audit
    assert not any(op == "WRITE" for *_, op in audit)


def test_operator_role_only_when_asked(tmp_path: Path) -> None:
    assert not any(e.role == "operator" for e in acls.pipeline_acls(_pipeline(tmp_path)))
    operator = [e for e in acls.role_acls(_pipeline(tmp_path), operator=True) if e.role == "operator"]
    assert ("cluster", "kafka-cluster", "literal", "ALTER") in _keys(operator)


def test_commands_parse_back_to_the_entries(tmp_path: Path) -> None:
    entries = acls.pipeline_acls(_pipeline(tmp_path), "User:eo", roles={"committer": "User:commit"})
    lines = acls.kafka_acls_commands(entries, bootstrap="k1:9092")
    commands = [shlex.split(line) for line in lines if line.startswith("kafka-acls.sh")]
    back = set()
    for argv in commands:
        assert argv[:5] == ["kafka-acls.sh", "--bootstrap-server", "k1:9092", "--add", "--allow-principal"]
        ops = [argv[i + 1] for i, a in enumerate(argv) if a == "--operation"]
        pattern = "prefixed" if "--resource-pattern-type" in argv else "literal"
        if "--cluster" in argv:
            kind, name = "cluster", "kafka-cluster"
        else:
            flag = next(a for a in argv if a in ("--topic", "--group", "--transactional-id"))
            kind, name = flag[2:], argv[argv.index(flag) + 1]
        back |= {(argv[5], kind, name, pattern, op) for op in ops}
    spelled = {
        (e.principal, e.resource_type, e.resource, e.pattern, acls._CLI_OPERATION[e.operation])
        for e in entries
    }
    assert back == spelled


def test_principal_and_role_flags_are_checked() -> None:
    assert acls.parse_role_principals(["audit=User:a"]) == {"audit": "User:a"}
    with pytest.raises(ConfigError, match="ROLE one of"):
        acls.parse_role_principals(["auditor=User:a"])
    with pytest.raises(ConfigError, match="needs its type"):
        acls.parse_role_principals(["audit=alice"])


def test_access_denied_names_operation_resource_and_the_grant() -> None:
    config = {"bootstrap.servers": "k1:9092", "sasl.username": "eo"}
    exc = acls.access_denied("pipeline 'orders': planning", "DESCRIBE", "group", "eo.orders", config=config)
    assert isinstance(exc, KafkaAccessDenied)
    assert (exc.operation, exc.resource_type, exc.resource) == ("DESCRIBE", "group", "eo.orders")
    text = str(exc)
    assert "refused User:eo DESCRIBE on group 'eo.orders'" in text
    grant = "kafka-acls.sh --bootstrap-server k1:9092 --add --allow-principal User:eo"
    assert f"{grant} --operation Describe --group eo.orders" in text
    assert issubclass(TransactionalIdUnauthorized, KafkaAccessDenied)


def test_java_refusals_are_recognised() -> None:
    text = (
        "org.apache.spark.SparkException: Job aborted ... Caused by: "
        "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access topics: [in-a]"
    )
    exc = acls.java_access_denied(text, "prepare")
    assert exc is not None and (exc.operation, exc.resource) == ("READ", "in-a")
    group = acls.java_access_denied(
        "GroupAuthorizationException: Not authorized to access group: eo-read.orders", "prepare"
    )
    assert group is not None and (group.resource_type, group.resource) == ("group", "eo-read.orders")
    assert acls.java_access_denied("java.lang.OutOfMemoryError", "prepare") is None


def test_doctor_acls_prints_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _pipeline(tmp_path)
    monkeypatch.setattr(diagnose, "load", lambda ref: pipeline)
    result = CliRunner().invoke(
        cli.app, ["doctor", "x:y", "--acls", "--principal", "User:svc", "--role-principal", "audit=User:aud"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "# planner" not in lines  # one principal's planner needs are held by its prepare's READ
    assert "# prepare" in lines and "# committer" in lines and "# audit" in lines
    assert (
        "kafka-acls.sh --bootstrap-server k1:9092 --add --allow-principal User:svc --operation Write "
        "--transactional-id eo.orders. --resource-pattern-type prefixed"
    ) in lines
    assert any("--allow-principal User:aud --operation Read --topic out" in line for line in lines)
    bad = CliRunner().invoke(cli.app, ["doctor", "x:y", "--acls", "--role-principal", "nobody=User:x"])
    assert bad.exit_code == 1 and "ROLE one of" in " ".join(bad.stderr.split())


def test_structured_streaming_roles_replace_the_planner_prepare_committer_and_watcher(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path)
    entries = acls.role_acls(pipeline, "User:eo", structured_streaming=True)
    assert list(dict.fromkeys(e.role for e in entries)) == list(acls.QUERY_ROLES)
    # The user's query: READ on its source topics, no group (Spark's source assigns partitions
    # on the executors and lists offsets with an AdminClient on the driver).
    assert _keys([e for e in entries if e.role == "query"]) == {
        ("topic", "in-a", "literal", "READ"),
        ("topic", "in-b", "literal", "READ"),
    }
    sink = _keys(acls.minimal(e for e in entries if e.role == "sink"))
    assert sink == {
        ("topic", "in-a", "literal", "READ"),
        ("topic", "in-b", "literal", "READ"),
        ("topic", "out", "literal", "READ"),
        ("topic", "out", "literal", "WRITE"),
        ("topic", "out", "literal", "DESCRIBE_CONFIGS"),
        ("group", "eo.orders", "literal", "READ"),
        ("group", "eo-marker.orders", "literal", "READ"),
        ("group", "eo-readback-", "prefixed", "DESCRIBE"),
        ("transactional-id", "eo.orders.", "prefixed", "WRITE"),
    }
    # recover is the sink's committer (its entries copied), plus --abort-hanging's.
    recover = _keys([e for e in entries if e.role == "recover"])
    assert {
        ("transactional-id", "eo.orders.", "prefixed", "WRITE"),
        ("group", "eo.orders", "literal", "READ"),
    } <= recover
    # One principal for everything: the same least set as a pipeline's.
    assert _keys(acls.pipeline_acls(pipeline, structured_streaming=True)) == _keys(
        acls.pipeline_acls(pipeline)
    )
    assert acls.parse_role_principals(["query=User:q", "sink=User:s"]) == {
        "query": "User:q",
        "sink": "User:s",
    }


def test_doctor_acls_of_a_sink_prints_the_query_and_sink_roles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    from airflow_provider_eo.streaming import KafkaExactlyOnceSink

    module = types.ModuleType("eo_acl_sinks")
    module.ORDERS = KafkaExactlyOnceSink(  # type: ignore[attr-defined]
        name="orders",
        kafka={"bootstrap.servers": "k1:9092"},
        sink_topic="out",
        ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
    )
    monkeypatch.setitem(sys.modules, "eo_acl_sinks", module)
    result = CliRunner().invoke(
        cli.app,
        [
            "doctor",
            "eo_acl_sinks:ORDERS",
            "--acls",
            "--source-topic",
            "in-a",
            "--role-principal",
            "query=User:q",
            "--role-principal",
            "sink=User:s",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "# query" in lines and "# sink" in lines
    assert not {"# planner", "# prepare", "# committer", "# watcher"} & set(lines)
    grant = "kafka-acls.sh --bootstrap-server k1:9092 --add --allow-principal"
    assert f"{grant} User:q --operation Read --topic in-a" in lines
    assert any(f"{grant} User:s --operation Read --topic in-a" in line for line in lines)  # TxnOffsetCommit
    assert (
        f"{grant} User:s --operation Write --transactional-id eo.orders. --resource-pattern-type prefixed"
        in lines
    )
    # Before its first batch the ledger does not know the query's topics: the error says how.
    unknown = CliRunner().invoke(cli.app, ["doctor", "eo_acl_sinks:ORDERS", "--acls"])
    assert unknown.exit_code == 1 and "--source-topic" in " ".join(unknown.stderr.split()), unknown.output
    # --source-topic is refused for a pipeline.
    monkeypatch.setattr(diagnose, "load", lambda ref: _pipeline(tmp_path))
    bad = CliRunner().invoke(cli.app, ["doctor", "x:y", "--acls", "--source-topic", "in-a"])
    assert bad.exit_code == 1 and "Structured Streaming sink" in " ".join(bad.stderr.split())
