"""Session-wide fixtures: one real Kafka broker and one Spark session per test run."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# Test transforms/pipelines must be importable by Spark's Python workers and by `eo`
# subprocesses, not only by this interpreter.
sys.path.insert(0, str(TESTS))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka broker (KRaft, transactions on) for the whole session, stopped at the end.

    It uses its own state folder so it never touches a developer's `eo dev up` broker.
    """
    from airflow_provider_eo.stack.kafka import LocalKafka, pid_alive

    external = os.environ.get("EO_TEST_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    # One folder per test session: concurrent sessions (a developer's and an agent's,
    # or two CI shards) must never stop each other's broker. Folders of sessions that
    # died are cleaned here.
    parent = ROOT / ".eo" / "test-kafka"
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.iterdir():
        owner = int(old.name) if old.name.isdigit() else -1
        if old.is_dir() and not (owner > 0 and pid_alive(owner)):  # its session is gone: stop and delete
            LocalKafka(home=old).wipe()
    kafka = LocalKafka(home=parent / str(os.getpid()))
    kafka.wipe()  # a fresh log every session: tests count records exactly
    info = kafka.up(timeout_s=120)
    try:
        yield info.bootstrap
    finally:
        kafka.wipe()


@pytest.fixture(scope="session")
def kafka_config(kafka_bootstrap: str) -> dict[str, Any]:
    """librdkafka-style client config for the session broker."""
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture()
def make_topic(kafka_config: dict[str, Any]) -> Callable[..., str]:
    """Create a uniquely named topic; returns its name."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    def _make(prefix: str = "t", partitions: int = 1, **topic_config: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topic(kafka_config, name, partitions=partitions, topic_config=topic_config)
        return name

    return _make


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession with the Kafka connector, shared by the session's tests."""
    from airflow_provider_eo.spark.session import get_spark

    session = get_spark("eo-tests")
    try:
        yield session
    finally:
        session.stop()
