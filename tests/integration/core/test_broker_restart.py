"""A broker restart in the middle of a commit transaction, on a broker of the test's own."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import QUICK_RESTART_CONFIG
from eo_harness import Harness, wait_for

from airflow_provider_eo.kafka.admin import ensure_topic
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import LocalKafka, pid_alive, port_in_use

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture()
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    kafka = LocalKafka(home=tmp_path / "kafka", extra_config=QUICK_RESTART_CONFIG)
    kafka.up(timeout_s=120)
    try:
        yield kafka
    finally:
        kafka.wipe()


def _harness(kafka: LocalKafka, tmp_path: Path, spark: Any) -> Harness:
    info = kafka.info()
    assert info is not None
    config = {"bootstrap.servers": info.bootstrap}
    source, sink = f"src-{uuid.uuid4().hex[:6]}", f"sink-{uuid.uuid4().hex[:6]}"
    ensure_topic(config, source, partitions=2)
    ensure_topic(config, sink, partitions=2)
    pipeline = Pipeline(
        name=f"restart-{uuid.uuid4().hex[:6]}",
        kafka=config,
        source_topics=[source],
        sink_topic=sink,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
    )
    return Harness(pipeline, config, spark)


def test_broker_restart_mid_transaction(own_broker: LocalKafka, tmp_path: Path, spark: Any) -> None:
    info = own_broker.info()
    assert info is not None
    h = _harness(own_broker, tmp_path, spark)
    pipeline = h.pipeline
    h.produce(200)
    planned, committer = h.paused_commit()
    try:
        own_broker.down()  # the open transaction's coordinator goes away ...
        assert own_broker.up(timeout_s=120).port == info.port  # ... and comes back
    finally:
        os.kill(committer.pid, signal.SIGCONT)
    committer.communicate(timeout=300)
    state = h.ledger.get(pipeline.name, planned.checkpoint_id).state
    if committer.returncode != 0 or state is not CheckpointState.COMMITTED:
        h.commit(planned.checkpoint_id)  # the retry finishes whatever is left
    assert h.ledger.get(pipeline.name, planned.checkpoint_id).state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=200)
    h.ledger.close()


def test_a_kept_producer_after_a_broker_kill_and_restart_does_not_hold_the_next_commit(
    own_broker: LocalKafka, tmp_path: Path, spark: Any
) -> None:
    """A committer keeps its producer between checkpoints. The broker is SIGKILLed and
    started again; that kept producer's next ``send_offsets_to_transaction`` (the commit
    marker) would wait for the group coordinator past its own time-out, with no end
    (librdkafka checks no time-out on coordinator requests). A kept producer that lost its
    connection while idle is not reused: a fresh one publishes, every source record once."""
    info = own_broker.info()
    assert info is not None
    h = _harness(own_broker, tmp_path, spark).with_(transaction_timeout_ms=10_000)
    h.produce(100)
    assert h.run_once().checkpoint is not None  # the producer is kept for the next commit
    os.kill(info.pid, signal.SIGKILL)
    wait_for(
        lambda: not (pid_alive(info.pid) or port_in_use(info.port)),
        "the killed broker's process and port to be gone",
        timeout=60,
    )
    again = LocalKafka(home=own_broker.home, port=info.port, extra_config=QUICK_RESTART_CONFIG)
    assert again.up(timeout_s=120).port == info.port
    h.produce(100, start=100)
    started = time.monotonic()
    result = h.run_once()
    took = time.monotonic() - started
    assert result.checkpoint is not None and result.checkpoint.state is CheckpointState.COMMITTED
    assert took < 120, f"the commit after the restart took {took:.0f} s"
    h.assert_exactly_once(expected_records=200)
    h.ledger.close()
