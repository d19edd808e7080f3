"""core/metrics.py: what each protocol moment reports, and that a failing sink changes nothing."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest

from airflow_provider_eo.core.metrics import (
    CHECKPOINT_ABORTED,
    CHECKPOINT_RECORDS,
    COMMIT_SECONDS,
    DEAD_LETTERS,
    LAG_RECORDS,
    PREPARE_SECONDS,
    PipelineMetrics,
    RecordingSink,
)
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, RangeSpec


def _cp(records: int | None, dead: int | None) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="orders",
        checkpoint_id=3,
        state=CheckpointState.COMMITTED,
        lineage=1,
        ranges=(RangeSpec("in", 0, 0, 10),),
        planned_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        records=records,
        dead_letters=dead,
    )


def test_each_moment_sends_its_metrics_with_the_pipeline() -> None:
    sink = RecordingSink()
    metrics = PipelineMetrics(sink, "orders")
    metrics.committed(_cp(42, 2), 1.5)
    metrics.prepared(3.25)
    metrics.aborted()
    metrics.lag(7)
    assert sink.sent == [
        ("count", CHECKPOINT_RECORDS, 42, "orders"),
        ("count", DEAD_LETTERS, 2, "orders"),
        ("seconds", COMMIT_SECONDS, 1.5, "orders"),
        ("seconds", PREPARE_SECONDS, 3.25, "orders"),
        ("count", CHECKPOINT_ABORTED, 1, "orders"),
        ("gauge", LAG_RECORDS, 7, "orders"),
    ]


def test_unknown_counts_are_zero_and_an_unmeasured_commit_sends_no_time() -> None:
    sink = RecordingSink()
    PipelineMetrics(sink, "orders").committed(_cp(None, None), None)
    assert sink.sent == [("count", CHECKPOINT_RECORDS, 0, "orders"), ("count", DEAD_LETTERS, 0, "orders")]


def test_no_sink_sends_nothing() -> None:
    PipelineMetrics(None, "orders").committed(_cp(1, 0), 1.0)  # nothing to assert: no error


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    def count(self, name: str, value: int, *, pipeline: str) -> None:
        self.calls += 1
        raise OSError("statsd host unreachable")

    seconds = count  # type: ignore[assignment]
    gauge = count  # type: ignore[assignment]


def test_a_failing_sink_is_logged_and_every_metric_is_still_tried(caplog: pytest.LogCaptureFixture) -> None:
    sink = _Broken()
    with caplog.at_level(logging.WARNING, logger="airflow_provider_eo.core.metrics"):
        PipelineMetrics(sink, "orders").committed(_cp(5, 1), 0.5)
    assert sink.calls == 3
    assert "pipeline orders: metric eo.checkpoint.records not sent: OSError" in caplog.text


def test_lag_after_a_commit_is_the_log_end_beyond_the_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.kafka import admin

    asked: list[list[tuple[str, int]]] = []

    def list_offsets(config: Any, partitions: Any, *, spec: str, timeout_s: float) -> dict[Any, int]:
        asked.append(list(partitions))
        assert spec == "latest"  # the last stable offset, as the plan reads it
        return {("in", 0): 17}

    monkeypatch.setattr(admin, "list_offsets", list_offsets)
    sink = RecordingSink()
    PipelineMetrics(sink, "orders").lag_after({"bootstrap.servers": "b:9092"}, _cp(10, 0))
    assert asked == [[("in", 0)]]
    assert sink.sent == [("gauge", LAG_RECORDS, 7, "orders")]  # 17 - the checkpoint's end 10

    PipelineMetrics(None, "orders").lag_after({"bootstrap.servers": "b:9092"}, _cp(10, 0))
    assert len(asked) == 1  # no sink: Kafka is not asked


def test_lag_not_measured_is_logged_and_not_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_provider_eo.errors import KafkaAdminError
    from airflow_provider_eo.kafka import admin

    def list_offsets(*args: Any, **kwargs: Any) -> dict[Any, int]:
        raise KafkaAdminError("no answer in 5 s")

    monkeypatch.setattr(admin, "list_offsets", list_offsets)
    sink = RecordingSink()
    with caplog.at_level(logging.WARNING, logger="airflow_provider_eo.core.metrics"):
        PipelineMetrics(sink, "orders").lag_after({"bootstrap.servers": "b:9092"}, _cp(10, 0))
    assert sink.sent == []
    assert "pipeline orders: lag not measured: KafkaAdminError: no answer in 5 s" in caplog.text
