"""notify.py and Pipeline(notifiers=...): who is called with what, and that a failing
notifier changes nothing but the log."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import pytest

from airflow_provider_eo.errors import DataLossError, StagingNotVisible
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, RangeSpec
from airflow_provider_eo.notify import notify, notify_committed, notify_refusal
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError
from airflow_provider_eo.version_compat import AirflowException


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, context: dict[str, Any]) -> None:
        self.calls.append(context)


def _boom(context: dict[str, Any]) -> None:
    raise AirflowException("smtp down")


def _pipeline(**notifiers: list[Any]) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "127.0.0.1:1"},
        source_topics=["in"],
        sink_topic="out",
        dead_letter_topic="dlq",
        max_dead_letters_per_checkpoint=10,
        notifiers=notifiers,
        notify_dead_letters_above=2,
    )


def _cp(dead: int) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="orders",
        checkpoint_id=4,
        state=CheckpointState.COMMITTED,
        lineage=1,
        ranges=(RangeSpec("in", 0, 0, 10),),
        planned_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        records=8,
        dead_letters=dead,
    )


def test_a_notifier_gets_the_context_plus_eo(context: dict[str, Any]) -> None:
    rec = Recorder()
    sent = notify(
        _pipeline(checkpoint_aborted=[rec]), "checkpoint_aborted", context, checkpoint_id=4, reason="x"
    )
    assert sent == 1
    (got,) = rec.calls
    assert got["ti"] is context["ti"]
    assert got["eo"] == {
        "event": "checkpoint_aborted",
        "pipeline": "orders",
        "checkpoint_id": 4,
        "reason": "x",
        "dag_id": "d",
        "run_id": "r1",
        "task_id": "eo.x",
    }
    assert "eo" not in context  # the task's own context is left as it was


def test_a_raising_notifier_is_logged_and_the_next_one_still_runs(
    context: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    with caplog.at_level(logging.ERROR, logger="airflow_provider_eo.notify"):
        sent = notify(_pipeline(data_loss=[_boom, rec]), "data_loss", context, reason="gone")
    assert sent == 1 and len(rec.calls) == 1
    assert "notifier function for data_loss (checkpoint None) failed" in caplog.text


def test_only_the_events_named_are_notified(context: dict[str, Any]) -> None:
    rec = Recorder()
    assert notify(_pipeline(data_loss=[rec]), "stream_stalled", context) == 0
    assert rec.calls == []
    with pytest.raises(ValueError, match="unknown notification event 'nope'"):
        notify(_pipeline(), "nope", context)


def test_dead_letters_notify_only_above_the_threshold(context: dict[str, Any]) -> None:
    rec = Recorder()
    pipeline = _pipeline(dead_letters=[rec])
    notify_committed(pipeline, context, _cp(2))  # at the threshold: quiet
    assert rec.calls == []
    notify_committed(pipeline, context, _cp(3))
    (got,) = rec.calls
    assert got["eo"]["dead_letters"] == 3 and got["eo"]["records"] == 8
    assert got["eo"]["checkpoint_id"] == 4 and got["eo"]["dead_letter_topic"] == "dlq"


@pytest.mark.parametrize("error", [DataLossError("retention took [0, 5)"), StagingNotVisible("no manifest")])
def test_a_data_loss_refusal_notifies(context: dict[str, Any], error: Exception) -> None:
    rec = Recorder()
    assert notify_refusal(_pipeline(data_loss=[rec]), context, error, checkpoint_id=9)
    (got,) = rec.calls
    assert got["eo"]["error"] == type(error).__name__
    assert got["eo"]["reason"] == str(error) and got["eo"]["checkpoint_id"] == 9


def test_other_errors_do_not_notify(context: dict[str, Any]) -> None:
    rec = Recorder()
    assert not notify_refusal(_pipeline(data_loss=[rec]), context, RuntimeError("not a refusal"))
    assert rec.calls == []


def test_an_airflow_base_notifier_renders_its_templates_from_eo(context: dict[str, Any]) -> None:
    from airflow.sdk import BaseNotifier

    class Collect(BaseNotifier):
        template_fields = ("message",)

        def __init__(self, message: str) -> None:
            super().__init__()
            self.message = message
            self.sent: list[str] = []

        def notify(self, context: Any) -> None:
            self.sent.append(self.message)

    notifier = Collect("{{ eo.pipeline }}: checkpoint {{ eo.checkpoint_id }} aborted ({{ eo.reason }})")
    notify(
        _pipeline(checkpoint_aborted=[notifier]), "checkpoint_aborted", context, checkpoint_id=4, reason="bad"
    )
    assert notifier.sent == ["orders: checkpoint 4 aborted (bad)"]


def test_the_pipeline_refuses_unknown_events_and_non_callables() -> None:
    with pytest.raises(PipelineConfigError, match="event 'aborted'; use checkpoint_aborted"):
        _pipeline(aborted=[Recorder()])
    with pytest.raises(PipelineConfigError, match="not callable"):
        _pipeline(data_loss=["ops@example.com"])
    with pytest.raises(PipelineConfigError, match="must be a list"):
        _pipeline(data_loss=Recorder())  # type: ignore[arg-type]


def test_notifiers_never_travel_to_spark() -> None:
    pipeline = _pipeline(data_loss=[Recorder()])
    doc = json.loads(pipeline.to_json())
    assert "notifiers" not in doc and "notify_dead_letters_above" not in doc
    back = Pipeline.from_json(pipeline.to_json())
    assert back.notifiers == {} and back.name == "orders"
