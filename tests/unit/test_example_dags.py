"""The savepoint, backfill and pipeline example DAGs parse without services and carry
the Params the Trigger DAG form shows."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _load(name: str, monkeypatch: pytest.MonkeyPatch, attr: str = "dag") -> Any:
    monkeypatch.syspath_prepend(str(DAGS))
    spec = importlib.util.spec_from_file_location(f"eo_example_{name}", DAGS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(f"eo_example_{name}", None)
    return getattr(module, attr)


def _validate(params: Any, conf: dict[str, Any]) -> None:
    """Validate ``conf`` against the DAG's Params as creating a DAG run does."""
    merged = copy.deepcopy(params)
    merged.update(conf)
    merged.validate()


def test_savepoint_dag_params(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = _load("eo_control_dags", monkeypatch, "savepoint_dag")
    assert dag.dag_id == "eo_savepoint"
    assert dag.schedule is None or str(dag.schedule) == "None"
    params = dag.params
    assert set(params.keys()) == {"pipeline", "name", "note", "stop", "wait_seconds"}
    assert params["pipeline"] == "eo_demo_pipelines:demo_pipeline"
    assert params["stop"] is False and params["note"] == ""
    _validate(params, {"name": "before-v2", "stop": True})
    # The form's name starts empty: a run needs one (an unscheduled DAG may have that default).
    for bad in ({}, {"name": "has space"}, {"name": ""}, {"name": "ok", "stop": "maybe"}):
        with pytest.raises(ParamValidationError):
            _validate(params, bad)
    task = dag.get_task("savepoint")
    assert task.savepoint_name == "{{ params.name }}" and task.stop == "{{ params.stop }}"


def test_pipeline_dag_restore_from_param(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _load("eo_pipeline", monkeypatch)
    assert dag.params["restore_from"] is None
    _validate(dag.params, {"restore_from": "sp1"})
    _validate(dag.params, {})
    assert dag.get_task("eo.plan").restore_from == "{{ params.get('restore_from') or '' }}"


def test_backfill_dag_is_daily_with_catchup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_DEMO_SINK_TOPIC", "enriched")
    monkeypatch.delenv("EO_BACKFILL_SINK_TOPIC", raising=False)
    dag = _load("eo_backfill", monkeypatch)
    assert dag.catchup is True and dag.max_active_runs == 1
    assert dag.params["sink_topic"] == "enriched.backfill"
    task = dag.get_task("backfill")
    assert task.start == "{{ data_interval_start }}" and task.end == "{{ data_interval_end }}"
    # A data-interval timetable: a run's interval is the whole previous day.
    from airflow.sdk import CronDataIntervalTimetable

    assert isinstance(dag.timetable, CronDataIntervalTimetable)


def test_control_dag_params(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = _load("eo_control_dags", monkeypatch, "control_dag")
    assert dag.dag_id == "eo_control"
    assert set(dag.params.keys()) == {"pipeline", "action", "reason"}
    _validate(dag.params, {"pipeline": "eo_demo_pipelines:demo_pipeline", "action": "resume"})
    for bad in ({"action": "restart"}, {"pipeline": "m:P"}):  # only the listed pipelines
        with pytest.raises(ParamValidationError):
            _validate(dag.params, bad)
    task = dag.get_task("control")
    assert task.action == "{{ params.action }}" and task.pipeline == "{{ params.pipeline }}"
