"""Clear errors from the local stack: port collisions, missing tools."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from airflow_provider_eo.stack import maven
from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.kafka import BrokerInfo, LocalKafka, free_port, new_cluster_id, port_in_use


def test_port_collision_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        busy = sock.getsockname()[1]
        assert port_in_use(busy)
        with pytest.raises(StackError, match=rf"port {busy} .* already in use.*--port"):
            LocalKafka(home=tmp_path, port=busy)._ports()


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
