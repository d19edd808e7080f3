"""Reading the Java transaction admin tool's output, and running it (no broker: the JVM's
start, its properties file and its failures)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from airflow_provider_eo.errors import ConfigError, TransactionAdminUnavailable
from airflow_provider_eo.kafka.transactions import (
    JavaAdmin,
    PartitionProducer,
    _properties_text,
    java_admin_properties,
    join_open_transactions,
    parse_tool_output,
)

NOW = 1_800_000_000_000


def _txn(
    tid: str, pid: int, parts: list[list[object]], *, state: str = "ONGOING", start: int = NOW - 42_000
) -> str:
    return json.dumps(
        {
            "kind": "transaction",
            "transactional_id": tid,
            "producer_id": pid,
            "producer_epoch": 3,
            "coordinator_id": 1,
            "state": state,
            "start_ms": start,
            "timeout_ms": 60000,
            "partitions": parts,
        }
    )


def _producer(topic: str, partition: int, pid: int, *, coordinator_epoch: int = -1) -> str:
    return json.dumps(
        {
            "kind": "producer",
            "topic": topic,
            "partition": partition,
            "producer_id": pid,
            "producer_epoch": 3,
            "coordinator_epoch": coordinator_epoch,
            "start_offset": 10,
            "last_timestamp": NOW - 90_000,
        }
    )


def test_tool_output_is_parsed_and_noise_ignored() -> None:
    text = "\n".join(
        [
            "SLF4J: No SLF4J providers were found.",
            _txn("eo.p.0", 7, [["out", 1], ["__consumer_offsets", 12]]),
            _producer("out", 1, 7, coordinator_epoch=2),
            '{"kind":"error","call":"producers out-2","type":"TopicAuthorizationException","message":"no"}',
            "{not json",
        ]
    )
    out = parse_tool_output(text)
    (t,) = out.transactions
    assert t.transactional_id == "eo.p.0" and t.partitions == (("__consumer_offsets", 12), ("out", 1))
    assert t.start_ms == NOW - 42_000 and t.state == "ONGOING"
    (p,) = out.producers
    assert p.coordinator_epoch == 2 and p.start_offset == 10
    assert out.errors == ("producers out-2: TopicAuthorizationException: no",)
    none = parse_tool_output(_txn("x", 1, [], start=-1) + "\n" + _producer("out", 0, 1))
    assert none.transactions[0].start_ms is None and none.producers[0].coordinator_epoch is None


def test_join_keeps_what_touches_the_partitions_and_finds_the_hanging() -> None:
    wanted = [("out", 0), ("out", 1), ("__consumer_offsets", 12)]
    out = parse_tool_output(
        "\n".join(
            [
                _txn("eo.p.0", 7, [["out", 1], ["__consumer_offsets", 12]]),
                _txn("elsewhere", 8, [["other", 0]]),  # not on our partitions: left out
                _producer("out", 1, 7),
                _producer("out", 0, 9),  # no coordinator holds producer 9: hanging
                _producer("other", 0, 8),
            ]
        )
    )
    view = join_open_transactions(out, wanted, now_ms=NOW)
    assert [t.transactional_id for t in view.transactions] == ["eo.p.0", None]
    known, hanging = view.transactions
    assert known.partitions == (("__consumer_offsets", 12), ("out", 1)) and known.known
    assert known.age_s(NOW) == 42 and not known.hanging(NOW)
    assert (
        known.describe(NOW)
        == "'eo.p.0', producer 7/3, ONGOING on __consumer_offsets[12], out[1], open for 42s"
    )
    assert hanging.producer_id == 9 and hanging.partitions == (("out", 0),) and hanging.hanging(NOW)
    assert hanging.age_s(NOW) is None and "age unknown" in hanging.describe(NOW)  # no coordinator start
    assert "transactional id unknown" in hanging.describe(NOW)
    too_old = join_open_transactions(
        parse_tool_output(_txn("t", 1, [["out", 0]], start=NOW - 61_000)), wanted, now_ms=NOW
    )
    assert too_old.transactions[0].hanging(NOW)  # past its own timeout


def test_java_properties_escape_every_character() -> None:
    text = _properties_text(
        {"sasl.jaas.config": 'x required username="u" password="p=#:\\ é";', "a b": " lead"}
    )
    assert text.splitlines() == [
        "a\\ b=\\ lead",
        'sasl.jaas.config=x required username\\="u" password\\="p\\=\\#\\:\\\\ \\u00e9";',
    ]
    assert "\\ud83d\\ude00" in _properties_text({"k": "\U0001f600"})


def test_admin_properties_are_the_java_clients_translation() -> None:
    props = java_admin_properties(
        {
            "bootstrap.servers": "b:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "secret",
            "java.ssl.truststore.type": "PKCS12",
        },
        owner="pipeline 'p'",
    )
    assert props["bootstrap.servers"] == "b:9093" and props["security.protocol"] == "SASL_SSL"
    assert "secret" in props["sasl.jaas.config"] and props["ssl.truststore.type"] == "PKCS12"
    with pytest.raises(ConfigError, match=r"ssl\.cipher\.suites"):
        java_admin_properties(
            {"bootstrap.servers": "b", "security.protocol": "SSL", "ssl.cipher.suites": "X"}, owner="p"
        )


def _fake_java(tmp_path: Path, body: str) -> str:
    """A `java` that records its arguments and the properties file it was given, then runs
    ``body`` (shell)."""
    script = tmp_path / f"java{len(list(tmp_path.glob('java*')))}"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/argv\n'
        'for a in "$@"; do case "$a" in *.properties) '
        f'cp "$a" {tmp_path}/props; stat -c %a "$a" > {tmp_path}/mode;; esac; done\n' + body
    )
    script.chmod(0o755)
    return str(script)


def test_secrets_go_through_a_private_file_removed_after(tmp_path: Path) -> None:
    line = _producer("out", 0, 5)
    java = _fake_java(tmp_path, f"echo '{line}'\n")
    admin = JavaAdmin(java, (tmp_path / "tool.jar",), timeout_s=5)
    config = {
        "bootstrap.servers": "b:1",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "hunter2",
    }
    view = admin.list_open(config, [("out", 0)], owner="pipeline 'p'", now_ms=NOW)
    assert view.transactions[0].producer_id == 5
    argv = (tmp_path / "argv").read_text()
    assert "hunter2" not in argv and "eo.kafka.Transactions" in argv and "list out:0" in argv
    assert "hunter2" in (tmp_path / "props").read_text()
    assert (tmp_path / "mode").read_text().strip() == "600"
    given = next(a for a in argv.split() if a.endswith(".properties"))
    assert not os.path.exists(given)  # removed after the call


def test_failures_name_what_happened(tmp_path: Path) -> None:
    config = {"bootstrap.servers": "b:1"}
    missing = JavaAdmin(str(tmp_path / "no-java"), (), timeout_s=1)
    with pytest.raises(TransactionAdminUnavailable, match="could not start"):
        missing.list_open(config, [], owner="pipeline 'p'", now_ms=NOW)
    refused = JavaAdmin(
        _fake_java(
            tmp_path,
            'echo \'{"kind":"error","call":"call","type":"TransactionalIdAuthorizationException",'
            '"message":"denied"}\'\nexit 1\n',
        ),
        (),
    )
    with pytest.raises(TransactionAdminUnavailable, match="DescribeTransactionalId") as err:
        refused.list_open(config, [], owner="pipeline 'p'", now_ms=NOW)
    assert "denied" in str(err.value)
    crashed = JavaAdmin(
        _fake_java(tmp_path, "echo 'Error: Could not find or load main class' >&2\nexit 1\n"), ()
    )
    with pytest.raises(
        TransactionAdminUnavailable, match=r"failed \(exit 1\): Error: Could not find or load main class"
    ):
        crashed.list_open(config, [], owner="pipeline 'p'", now_ms=NOW)
    producer = PartitionProducer("out", 0, 5, 3, None, 10, NOW)
    with pytest.raises(TransactionAdminUnavailable, match=r"producer 5 on out\[0\] was not aborted"):
        refused.abort(config, producer, owner="pipeline 'p'")


@pytest.mark.skipif(sys.platform != "linux", reason="a sleeping shell stands in for a stuck JVM")
def test_a_stuck_jvm_is_stopped_in_bounded_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.kafka.transactions as mod

    monkeypatch.setattr(mod, "_GRACE_S", 0.5)
    stuck = JavaAdmin(_fake_java(tmp_path, "exec sleep 30\n"), (), timeout_s=1)
    with pytest.raises(TransactionAdminUnavailable, match="did not finish"):
        stuck.list_open({"bootstrap.servers": "b:1"}, [], owner="pipeline 'p'", now_ms=NOW)
