"""EoBackfillOperator: interval parsing, the prepare callable's spark-submit arguments
and idempotence (run_backfill and spark-submit faked: the backfill itself is covered by
the core and the Airflow integration tests)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.core import backfill as core_backfill
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.operators import backfill as backfill_module
from airflow_provider_eo.operators.backfill import EoBackfillOperator, to_epoch_ms
from airflow_provider_eo.operators.submit import PrepareNotRecorded

DAY = 86_400_000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-01-02T00:00:00+00:00", 1735776000000),
        ("2025-01-02 00:00:00+00:00", 1735776000000),  # str() of a pendulum DateTime
        ("2025-01-02T00:00:00Z", 1735776000000),
        ("2025-01-02T00:00:00", 1735776000000),  # naive: UTC
        ("2025-01-02T01:00:00+01:00", 1735776000000),
        (dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc), 1735776000000),
        (1735776000000, 1735776000000),
        ("1735776000000", 1735776000000),
    ],
)
def test_to_epoch_ms(value: Any, expected: int) -> None:
    assert to_epoch_ms(value, field="start") == expected


def test_to_epoch_ms_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="start must be an ISO-8601 instant"):
        to_epoch_ms("yesterday", field="start")


def test_defaults_are_the_data_interval() -> None:
    op = EoBackfillOperator(task_id="b", pipeline="no.such:X", sink_topic="t")
    assert op.start == "{{ data_interval_start }}" and op.end == "{{ data_interval_end }}"
    assert {"start", "end", "sink_topic", "transform", "pipeline", "conf", "jars"} <= set(op.template_fields)


def test_runs_the_interval_and_prepares_by_spark_submit(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    submitted: list[dict[str, Any]] = []
    states = {7: CheckpointState.PLANNED, 8: CheckpointState.PREPARED}

    class FakeLedger:
        def get(self, name: str, checkpoint_id: int) -> Any:
            return SimpleNamespace(state=states[checkpoint_id])

    def fake_submit(task: Any, ctx: Any, **kwargs: Any) -> None:
        submitted.append(kwargs)
        states[kwargs["checkpoint_id"]] = CheckpointState.PREPARED

    def fake_run(live: Any, ledger: Any, start_ms: int, end_ms: int, **kwargs: Any) -> Any:
        seen.update(start_ms=start_ms, end_ms=end_ms, **kwargs)
        backfill = SimpleNamespace(
            name="orders~backfill", transform="acme.t:fn", staging_dir="s3a://bucket/orders"
        )
        kwargs["prepare"](backfill, FakeLedger(), 7)
        kwargs["prepare"](backfill, FakeLedger(), 8)  # already PREPARED: nothing submitted
        return SimpleNamespace(
            summary=lambda: {
                "pipeline": live.name,
                "backfill_pipeline": backfill.name,
                "checkpoints": [7, 8],
                "records": 12,
            }
        )

    monkeypatch.setattr(core_backfill, "run_backfill", fake_run)
    monkeypatch.setattr(backfill_module, "submit_prepare", fake_submit)
    op = EoBackfillOperator(
        task_id="b",
        pipeline=pipeline_ref,
        start="2025-01-01T00:00:00+00:00",
        end="2025-01-02 00:00:00+00:00",
        sink_topic="out.backfill",
        transform="m:f",
    )
    out = op.execute(context)
    assert seen["start_ms"] == 1735689600000 and seen["end_ms"] - seen["start_ms"] == DAY
    assert seen["sink_topic"] == "out.backfill" and seen["transform"] == "m:f"
    assert seen["allow_live_sink"] is False and seen["actor"].run_id == "r1"
    assert [s["checkpoint_id"] for s in submitted] == [7]
    assert submitted[0]["extra_args"] == [
        "--backfill-sink-topic",
        "out.backfill",
        "--backfill-transform",
        "m:f",
    ]
    assert submitted[0]["pipeline_ref"] == pipeline_ref and submitted[0]["pipeline_name"] == "orders~backfill"
    assert submitted[0]["staging_dir"] == "s3a://bucket/orders"  # for Hadoop's S3A connector
    assert out["records"] == 12 and out["checkpoints"] == [7, 8]
    assert out["backfill_pipeline"] == "orders~backfill" and out["pipeline"] == "orders"
    assert out["start"] == "2025-01-01T00:00:00+00:00"


def test_prepare_not_recorded_is_an_error(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FakeLedger:
        def get(self, name: str, checkpoint_id: int) -> Any:
            return SimpleNamespace(state=CheckpointState.PLANNED)

    def fake_run(live: Any, ledger: Any, start_ms: int, end_ms: int, **kwargs: Any) -> Any:
        kwargs["prepare"](SimpleNamespace(name="bf", transform=None, staging_dir="/tmp/bf"), FakeLedger(), 1)

    monkeypatch.setattr(core_backfill, "run_backfill", fake_run)
    monkeypatch.setattr(backfill_module, "submit_prepare", lambda *_a, **_k: None)
    op = EoBackfillOperator(task_id="b", pipeline=pipeline_ref, start=0, end=DAY, sink_topic="t")
    with pytest.raises(PrepareNotRecorded, match="checkpoint 1 is PLANNED"):
        op.execute(context)
