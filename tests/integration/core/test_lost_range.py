"""A PLANNED range Kafka can no longer serve must not wedge the pipeline;
and ``eo abort``.

Real broker; records are deleted exactly with ``AdminClient.delete_records`` (what
retention does, at a chosen offset).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from eo_faultlib import assert_group_offsets_match_ledger
from eo_harness import EO, Harness, parse_json_line

from airflow_provider_eo.errors import DataLossError
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _delete_before(h: Harness, partition: int, offset: int) -> None:
    topic = h.pipeline.source_topics[0]
    client = AdminClient(h.config)  # kept alive until its futures resolve
    futures = client.delete_records([TopicPartition(topic, partition, offset)], request_timeout=30)
    for fut in futures.values():
        assert fut.result(timeout=60).low_watermark == offset  # the new log start


def _eo(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    env.pop("EO_FAULT", None)
    cmd = [EO, "abort", "eo_test_pipelines:from_env", *args, "--json"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_lost_planned_range_fails_by_name_every_time(harness: Callable[..., Harness]) -> None:
    """Default on_data_loss='fail': plan and prepare both name the lost range, every retry
    (old code: plan resumed the checkpoint silently, prepare failed inside Spark)."""
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(50)
    planned = h.plan()
    _delete_before(h, 0, 20)
    topic = h.pipeline.source_topics[0]
    for _ in range(2):
        with pytest.raises(DataLossError, match=rf"{topic}\[0\]: \[0, 20\).*on_data_loss='skip'.*eo abort"):
            h.plan()
        with pytest.raises(DataLossError, match=rf"{topic}\[0\]: \[0, 20\)"):
            h.prepare(planned.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.PLANNED


def test_lost_planned_range_with_skip_is_aborted_and_replanned(harness: Callable[..., Harness]) -> None:
    """on_data_loss='skip': the checkpoint is aborted with the lost range as its reason, the
    next one starts at the log start with the skip recorded, and the surviving records are
    published exactly once."""
    h = harness(source_partitions=1, sink_partitions=1, on_data_loss="skip")
    h.produce(50)
    planned = h.plan()
    _delete_before(h, 0, 20)
    results = h.drain()
    aborted = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert aborted.state is CheckpointState.ABORTED
    topic = h.pipeline.source_topics[0]
    assert f"{topic}[0]: [0, 20)" in (aborted.abort_reason or "")
    (replanned,) = results
    (rng,) = replanned.checkpoint.ranges
    assert (rng.skipped_from, rng.start, rng.end) == (0, 20, 50)
    h.assert_exactly_once(expected_records=30)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)


def test_eo_abort_command(harness: Callable[..., Harness]) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(40)
    planned = h.plan()
    # An unfinished checkpoint: aborted, its range replanned.
    proc = _eo(h, str(planned.checkpoint_id), "--reason", "operator asked")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert parse_json_line(proc.stdout)["state"] == "ABORTED"
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.ABORTED and cp.abort_reason == "operator asked"
    (result,) = h.drain()
    assert result.checkpoint.ranges == planned.ranges
    h.assert_exactly_once(expected_records=40)
    # A COMMITTED checkpoint is refused with a message; an unknown one is a clear error.
    proc = _eo(h, str(result.checkpoint.checkpoint_id), "--reason", "too late")
    assert proc.returncode != 0 and "COMMITTED" in proc.stderr, proc.stderr[-2000:]
    proc = _eo(h, "99", "--reason", "typo")
    assert proc.returncode != 0 and "checkpoint 99" in proc.stderr, proc.stderr[-2000:]
    assert h.ledger.get(h.pipeline.name, result.checkpoint.checkpoint_id).state is CheckpointState.COMMITTED
