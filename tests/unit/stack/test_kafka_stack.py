"""The local stack: clear errors (port collisions, missing tools) and the broker's listener settings."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from airflow_provider_eo.stack import maven
from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.kafka import (
    BrokerInfo,
    LocalKafka,
    broker_jvm_opts,
    free_port,
    new_cluster_id,
    port_in_use,
)


def test_port_collision_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        busy = sock.getsockname()[1]
        assert port_in_use(busy)
        with pytest.raises(StackError, match=rf"port {busy} .* already in use.*--port"):
            LocalKafka(home=tmp_path, port=busy)._ports()


def test_broker_jvm_options_follow_kafkas_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_HEAP_OPTS", raising=False)
    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    assert broker_jvm_opts() == [
        "-Xms256m",
        "-Xmx1g",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
    ]
    monkeypatch.setenv("KAFKA_HEAP_OPTS", "-Xmx512m")
    monkeypatch.setenv("KAFKA_JVM_PERFORMANCE_OPTS", "-XX:TieredStopAtLevel=1  -XX:+UseSerialGC")
    assert broker_jvm_opts() == ["-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def test_free_port_is_free() -> None:
    assert not port_in_use(free_port())


def test_missing_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="`java` was not found"):
        LocalKafka(home=tmp_path / "k").up(timeout_s=1)


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="`mvn` was not found"):
        maven._copy_dependencies("kafka-broker", tmp_path / "jars", {}, "test jars")


def test_info_is_none_without_a_broker(tmp_path: Path) -> None:
    kafka = LocalKafka(home=tmp_path)
    assert kafka.info() is None
    assert kafka.down() is False


def test_broker_that_never_answers_times_out_clearly(tmp_path: Path) -> None:
    import os

    info = BrokerInfo(pid=os.getpid(), port=free_port(), controller_port=free_port(), version="x")
    with pytest.raises(StackError, match=r"did not answer within 1s"):
        LocalKafka(home=tmp_path).wait_ready(info, timeout_s=1)


def test_cluster_id_never_starts_with_a_dash() -> None:
    """StorageTool reads ``format -t -…`` as a missing argument: such ids are redrawn."""
    draws = iter([b"\xfb" + bytes(15), bytes(16)])  # base64 "-w…", then "AAAA…"
    cluster_id = new_cluster_id(lambda: next(draws))
    assert cluster_id == "A" * 22


def test_a_sasl_ssl_listener_config(tmp_path: Path) -> None:
    from airflow_provider_eo.stack.kafka import ListenerSecurity

    security = ListenerSecurity(
        key_store=tmp_path / "broker.pem", ca=tmp_path / "ca.crt", users={"broker": "b-pw", "eo": "e-pw"}
    )
    kafka = LocalKafka(home=tmp_path, security=security)
    props = dict(line.split("=", 1) for line in kafka._write_config(9093, 9094).read_text().splitlines())
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9093"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert (
        props["sasl.enabled.mechanisms"] == props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    )
    assert (
        'username="broker" password="b-pw"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    )
    assert security.format_args() == [
        "--add-scram",
        "SCRAM-SHA-512=[name=broker,password=b-pw]",
        "--add-scram",
        "SCRAM-SHA-512=[name=eo,password=e-pw]",
    ]
    assert security.client_config("127.0.0.1:9093")["sasl.username"] == "broker"
    plain = LocalKafka(home=tmp_path / "plain")
    plain.home.mkdir()
    assert "PLAINTEXT://127.0.0.1:9093" in plain._write_config(9093, 9094).read_text()


def test_scram_users_the_storage_tool_cannot_spell_are_refused(tmp_path: Path) -> None:
    from airflow_provider_eo.stack.kafka import ListenerSecurity

    with pytest.raises(ValueError, match="may not contain"):
        ListenerSecurity(key_store=tmp_path, ca=tmp_path, users={"eo": "a,b"})
    with pytest.raises(ValueError, match="mechanism"):
        ListenerSecurity(key_store=tmp_path, ca=tmp_path, users={"eo": "x"}, mechanism="PLAIN")
