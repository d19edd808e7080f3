"""A broker restart in the middle of a commit transaction, on a broker of the test's own."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import Harness

from airflow_provider_eo.kafka.admin import ensure_topic
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import LocalKafka

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture()
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    kafka = LocalKafka(home=tmp_path / "kafka")
    kafka.up(timeout_s=120)
    try:
        yield kafka
    finally:
        kafka.wipe()


def test_broker_restart_mid_transaction(own_broker: LocalKafka, tmp_path: Path, spark: Any) -> None:
    info = own_broker.info()
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
    h = Harness(pipeline, config, spark)
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
