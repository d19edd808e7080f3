"""EoCheckpointSensor: poke, defer and resume against a real SQLite ledger."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.sensors.checkpoint import (
    CheckpointAborted,
    CheckpointNotPrepared,
    CheckpointWaitTimeout,
    EoCheckpointSensor,
)
from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger
from airflow_provider_eo.version_compat import AirflowException, AirflowSkipException


@pytest.fixture()
def planned(pipeline_ref: str) -> Any:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    return pipeline


def _prepare(pipeline: Any) -> None:
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )


def _sensor(ref: str, **kwargs: Any) -> EoCheckpointSensor:
    return EoCheckpointSensor(task_id="wait", pipeline=ref, checkpoint_id="1", poke_interval=1, **kwargs)


def test_no_work_at_construction() -> None:
    sensor = EoCheckpointSensor(task_id="w", pipeline="no.such.module:X", checkpoint_id="{{ x }}")
    from airflow_provider_eo.version_compat import default_deferrable

    # deferrable follows Airflow's [operators] default_deferrable unless given.
    assert sensor.deferrable is default_deferrable() and sensor.check_before_defer is True


def test_poke_mode(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    sensor = _sensor(pipeline_ref, deferrable=False)
    assert sensor.poke(context) is False
    _prepare(planned)
    result = sensor.poke(context)
    assert not isinstance(result, bool) and result.is_done
    assert result.xcom_value == {
        "status": "success",
        "pipeline": "orders",
        "checkpoint_id": 1,
        "state": "PREPARED",
    }


def test_poke_aborted_raises(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    with Ledger(planned.ledger_url) as ledger:
        ledger.abort(planned.name, 1, reason="bad staging")
    with pytest.raises(CheckpointAborted, match="bad staging"):
        _sensor(pipeline_ref, deferrable=False).poke(context)


def test_defers_to_trigger_while_planned(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    with pytest.raises(TaskDeferred) as deferred:
        _sensor(pipeline_ref, timeout=600).execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, EoCheckpointTrigger)
    assert deferred.value.method_name == "execute_complete"
    _, kwargs = trigger.serialize()
    assert kwargs["pipeline"] == "orders" and kwargs["checkpoint_id"] == 1
    assert kwargs["ledger_url"] == planned.ledger_url and kwargs["poll_interval"] == 1.0


def test_already_prepared_returns_without_deferring(
    pipeline_ref: str, planned: Any, context: dict[str, Any]
) -> None:
    _prepare(planned)
    assert _sensor(pipeline_ref).execute(context)["state"] == "PREPARED"


def test_always_defers_when_asked(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    _prepare(planned)
    with pytest.raises(TaskDeferred):
        _sensor(pipeline_ref, check_before_defer=False).execute(context)


@pytest.mark.parametrize(
    ("status", "error"), [("failed", CheckpointAborted), ("timeout", CheckpointWaitTimeout), ("?", None)]
)
def test_execute_complete(status: str, error: type[Exception] | None, context: dict[str, Any]) -> None:
    sensor = _sensor("x:y")
    event = {"status": status, "pipeline": "orders", "checkpoint_id": 1, "state": "PLANNED", "reason": "r"}
    with pytest.raises(error or CheckpointNotPrepared) as info:
        sensor.execute_complete(context, event)
    assert isinstance(info.value, AirflowException) and info.value.event == event


def test_execute_complete_success(context: dict[str, Any]) -> None:
    event = {"status": "success", "pipeline": "orders", "checkpoint_id": 1, "state": "PREPARED"}
    assert _sensor("x:y").execute_complete(context, event) == event


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    sensor = EoCheckpointSensor(task_id="wait", pipeline=pipeline_ref, checkpoint_id="None")
    with pytest.raises(AirflowSkipException):
        sensor.execute(context)


def test_wait_for_committed(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    _prepare(planned)
    sensor = _sensor(pipeline_ref, wait_for="committed")
    assert sensor.poke(context) is False  # PREPARED is not enough
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    assert deferred.value.trigger.serialize()[1]["wait_for"] == "committed"
    with Ledger(planned.ledger_url) as ledger:
        ledger.mark_committed(planned.name, 1)
    assert sensor.execute(context)["state"] == "COMMITTED"
    with pytest.raises(ValueError, match="wait_for"):
        _sensor(pipeline_ref, wait_for="published")


def test_committed_after(pipeline_ref: str, planned: Any, context: dict[str, Any]) -> None:
    import datetime as dt

    from airflow_provider_eo.triggers.checkpoint import EoCommittedAfterTrigger

    with pytest.raises(ValueError, match="not both"):
        _sensor(pipeline_ref, committed_after="2025-01-01T00:00:00")
    with pytest.raises(ValueError, match="not both"):
        EoCheckpointSensor(task_id="wait", pipeline=pipeline_ref)
    assert "committed_after" in EoCheckpointSensor.template_fields
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    sensor = EoCheckpointSensor(
        task_id="fresh", pipeline=pipeline_ref, committed_after=start.isoformat(), poke_interval=1
    )
    assert sensor.poke(context) is False
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, EoCommittedAfterTrigger)
    assert trigger.serialize()[1]["committed_after"] == start.isoformat()
    _prepare(planned)
    with Ledger(planned.ledger_url) as ledger:
        ledger.mark_committed(planned.name, 1)
    event = sensor.execute(context)
    assert event["status"] == "success" and event["checkpoint_id"] == 1
    poked = sensor.poke(context)
    assert not isinstance(poked, bool) and poked.is_done
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)
    assert (
        EoCheckpointSensor(task_id="f", pipeline=pipeline_ref, committed_after=later).poke(context) is False
    )
    bad = EoCheckpointSensor(task_id="f", pipeline=pipeline_ref, committed_after="yesterday")
    with pytest.raises(AirflowException, match="ISO-8601"):
        bad.poke(context)
    timeout = {"status": "timeout", "pipeline": "orders", "committed_after": "t", "reason": "late"}
    with pytest.raises(CheckpointWaitTimeout, match="late"):
        sensor.execute_complete(context, timeout)
    ok = {"status": "success", "pipeline": "orders", "committed_after": "t", "checkpoint_id": 1}
    assert sensor.execute_complete(context, ok) == ok
