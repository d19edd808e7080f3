"""EoSavepointOperator: arguments parsed from rendered templates, who took it, retry
idempotence (take_savepoint faked: waiting on checkpoints is covered by the core and the
Airflow integration tests)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.core import savepoint as core_savepoint
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.operators import savepoint as savepoint_module
from airflow_provider_eo.operators.savepoint import (
    SAVEPOINT_NAME_PATTERN,
    EoSavepointOperator,
    created_by_for,
    parse_bool,
)
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowFailException


def _fake_take(seen: dict[str, Any]) -> Any:
    def take(pipeline: Any, ledger: Ledger, name: str, **kwargs: Any) -> Any:
        seen.update(name=name, **kwargs)
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        return ledger.create_savepoint(
            pipeline.name,
            name,
            checkpoint_id=None,
            offsets={"in": {0: 3}},
            note=kwargs["note"],
            created_by=kwargs["created_by"],
        )

    return take


def test_templated_fields_and_no_work_at_construction() -> None:
    op = EoSavepointOperator(task_id="sp", pipeline="no.such:X", savepoint_name="{{ params.name }}")
    assert {"pipeline", "savepoint_name", "note", "stop", "wait_seconds"} <= set(op.template_fields)


def test_rendered_params_reach_take_savepoint(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(core_savepoint, "take_savepoint", _fake_take(seen))
    context["dag_run"] = SimpleNamespace(triggering_user_name="alice")
    op = EoSavepointOperator(
        task_id="sp",
        pipeline=pipeline_ref,
        savepoint_name="before-v2",
        note="n",
        stop="True",
        wait_seconds="42",
        deferrable=False,  # the blocking wait (the deferred one: below)
    )
    out = op.execute(context)
    assert seen["name"] == "before-v2" and seen["stop"] is True and seen["wait_s"] == 42.0
    assert seen["note"] == "n" and seen["actor"].run_id == "r1"
    assert seen["created_by"] == "airflow:d/r1 by alice"
    assert out["name"] == "before-v2" and out["created_by"] == "airflow:d/r1 by alice"
    assert out["offsets"] == {"in": {"0": 3}}


@pytest.mark.parametrize("name", ["", "has space", "-lead", "a/b", "x" * 129])
def test_bad_name_is_refused_before_anything(pipeline_ref: str, context: dict[str, Any], name: str) -> None:
    op = EoSavepointOperator(task_id="sp", pipeline=pipeline_ref, savepoint_name=name)
    with pytest.raises(AirflowFailException, match="savepoint name"):
        op.execute(context)


def test_pattern_accepts_ordinary_names() -> None:
    import re

    for name in ("a", "before-v2", "2025.01.01_nightly", "X" * 128):
        assert re.fullmatch(SAVEPOINT_NAME_PATTERN, name)


def test_retry_of_the_same_run_returns_the_recorded_savepoint(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.create_savepoint(pipeline.name, "sp1", checkpoint_id=None, offsets={"in": {0: 1}})
        recorded = ledger.get_savepoint(pipeline.name, "sp1")
    calls: list[str] = []

    def take(*_a: Any, **_k: Any) -> Any:
        calls.append("take")
        raise AssertionError("must not be called")

    monkeypatch.setattr(core_savepoint, "take_savepoint", take)
    # Recorded by this run: the retry returns it.
    monkeypatch.setattr(
        savepoint_module.EoSavepointOperator,
        "_already_taken",
        staticmethod(lambda *_a: recorded.summary()),
    )
    out = EoSavepointOperator(task_id="sp", pipeline=pipeline_ref, savepoint_name="sp1").execute(context)
    assert out["name"] == "sp1" and calls == []


def test_already_taken_matches_only_the_same_run(pipeline_ref: str) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        # unknown pipeline, unknown savepoint: not taken
        assert EoSavepointOperator._already_taken(ledger, pipeline.name, "x", "d", "r1") is None
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        assert EoSavepointOperator._already_taken(ledger, pipeline.name, "x", "d", "r1") is None
        ledger.create_savepoint(pipeline.name, "x", checkpoint_id=None, offsets={"in": {0: 1}})
        # recorded without a run (CLI): a second take must fail on the name, not return it
        assert EoSavepointOperator._already_taken(ledger, pipeline.name, "x", "d", "r1") is None


def test_created_by_without_a_user() -> None:
    ti = SimpleNamespace(dag_id="eo_savepoint", run_id="manual__1")
    assert created_by_for({"ti": ti}) == "airflow:eo_savepoint/manual__1"
    assert created_by_for({"ti": ti, "dag_run": SimpleNamespace(triggering_user_name=None)}) == (
        "airflow:eo_savepoint/manual__1"
    )


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("False", False), ("true", True), ("", False)])
def test_parse_bool(value: Any, expected: bool) -> None:
    assert parse_bool(value, field="stop") is expected


def test_parse_bool_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="stop must be a boolean"):
        parse_bool("maybe", field="stop")


def test_the_log_says_where_a_savepoint_without_a_checkpoint_points(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken after a restore or reset, before anything committed since: no checkpoint id."""
    logged: list[str] = []
    log = SimpleNamespace(
        info=lambda msg, *args: logged.append(msg % args), warning=lambda *a: None, debug=lambda *a: None
    )
    monkeypatch.setattr(EoSavepointOperator, "log", log)
    monkeypatch.setattr(core_savepoint, "take_savepoint", _fake_take({}))
    op = EoSavepointOperator(
        task_id="sp", pipeline=pipeline_ref, savepoint_name="replay-start", deferrable=False
    )
    assert op.execute(context)["checkpoint_id"] is None
    (line,) = [m for m in logged if "savepoint 'replay-start'" in m]
    assert "checkpoint None" not in line
    assert "before the first checkpoint, at the offsets a restore or reset started from" in line


def _checkpoint(ledger: Ledger, start: int, end: int, *, commit: bool) -> int:
    from airflow_provider_eo.ledger import RangeSpec

    cid = ledger.plan("orders", [RangeSpec("in", 0, start, end)]).checkpoint_id
    ledger.mark_prepared(
        "orders", cid, attempt="a", staging_location="/s", records=end - start, bytes_=1, shard_counts={0: 1}
    )
    if commit:
        ledger.mark_committed("orders", cid)
    return cid


def test_deferrable_stops_first_waits_in_the_triggerer_then_records(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger

    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        _checkpoint(ledger, 0, 10, commit=True)
        in_flight = _checkpoint(ledger, 10, 20, commit=False)
    op = EoSavepointOperator(
        task_id="sp", pipeline=pipeline_ref, savepoint_name="sp1", stop=True, wait_seconds=60, deferrable=True
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, EoCheckpointTrigger) and deferred.value.method_name == "execute_complete"
    assert (trigger.checkpoint_id, trigger.wait_for) == (in_flight, "committed")
    echo = trigger.serialize()[1]["echo"]  # what the event carries back (dag.test drops defer kwargs)
    with Ledger(pipeline.ledger_url) as ledger:
        assert ledger.get_pipeline("orders").stopped  # the stop came before the wait
        assert ledger.list_savepoints("orders") == []
        # Meanwhile the in-flight checkpoint commits and, stopped, nothing new is planned.
        ledger.mark_committed("orders", in_flight)
    event = {"status": "success", "pipeline": "orders", "checkpoint_id": in_flight, "state": "COMMITTED"}
    out = op.execute_complete(context, {**event, "echo": echo})
    assert out["name"] == "sp1" and out["checkpoint_id"] == in_flight and out["offsets"] == {"in": {"0": 20}}


def test_deferrable_timeout_fails_and_leaves_the_stop(pipeline_ref: str, context: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_eo.errors import SavepointTimeout

    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        _checkpoint(ledger, 0, 10, commit=True)
        stuck = _checkpoint(ledger, 10, 20, commit=False)
    op = EoSavepointOperator(
        task_id="sp", pipeline=pipeline_ref, savepoint_name="sp1", stop=True, wait_seconds=5, deferrable=True
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    echo = deferred.value.trigger.serialize()[1]["echo"]
    event = {
        "status": "timeout",
        "pipeline": "orders",
        "checkpoint_id": stuck,
        "state": "PREPARED",
        "echo": echo,
    }
    with pytest.raises(SavepointTimeout, match=f"checkpoint {stuck} is still PREPARED.*stays STOPPED"):
        op.execute_complete(context, event)
    with Ledger(pipeline.ledger_url) as ledger:
        assert ledger.get_pipeline("orders").stopped and ledger.list_savepoints("orders") == []


def test_deferrable_with_nothing_in_flight_records_at_once(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        done = _checkpoint(ledger, 0, 10, commit=True)
    op = EoSavepointOperator(task_id="sp", pipeline=pipeline_ref, savepoint_name="sp1", deferrable=True)
    assert op.execute(context)["checkpoint_id"] == done
