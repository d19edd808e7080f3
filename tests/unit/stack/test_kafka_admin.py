"""Where the Java transaction admin tool's jars and java come from, and what is said when
they are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_eo.stack import kafka_admin
from airflow_provider_eo.stack.errors import StackError


def _empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(kafka_admin.ENV_JARS, raising=False)


def test_no_kafka_clients_jar_names_where_it_looked_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _empty_home(tmp_path, monkeypatch)
    with pytest.raises(StackError, match="no kafka-clients jar") as err:
        kafka_admin.client_jars()
    text = str(err.value)
    assert "Spark's Kafka connector jars" in text and "the local broker's jars" in text
    assert "eo setup jars" in text and kafka_admin.ENV_JARS in text


def test_jars_given_by_the_environment_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _empty_home(tmp_path, monkeypatch)
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("kafka-clients-3.9.2.jar", "slf4j-api-2.0.16.jar", "lz4-java-1.8.0.jar"):
        (lib / name).write_bytes(b"")
    monkeypatch.setenv(kafka_admin.ENV_JARS, str(lib))
    assert [p.name for p in kafka_admin.client_jars()] == ["kafka-clients-3.9.2.jar", "slf4j-api-2.0.16.jar"]


def test_no_java_or_no_jdk_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _empty_home(tmp_path, monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(StackError, match=r"no Java runtime.*openjdk-17-jre-headless"):
        kafka_admin.java_binary()
    with pytest.raises(StackError, match=r"no JDK .*javac and jar.*eo setup jars"):
        kafka_admin.tool_jar([tmp_path / "kafka-clients-3.9.2.jar"])


def test_an_airflow_worker_never_compiles_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.stack.maven import FORBID_ENV

    _empty_home(tmp_path, monkeypatch)
    monkeypatch.setenv(FORBID_ENV, "1")
    with pytest.raises(StackError, match=r"transaction admin tool .*eo setup jars"):
        kafka_admin.tool_jar([tmp_path / "kafka-clients-3.9.2.jar"])
