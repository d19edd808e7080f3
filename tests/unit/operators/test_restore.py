"""EoRestoreOperator and the plan task's restore_from: one restore per DAG run
(restore_from_savepoint faked: the restore itself is covered by the core tests)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.core import coordinator as core_plan  # the plan step the task calls
from airflow_provider_eo.core import restore as core_restore
from airflow_provider_eo.core.restore import RestoreResult
from airflow_provider_eo.errors import PipelineStopped
from airflow_provider_eo.operators import restore as restore_module  # noqa: F401
from airflow_provider_eo.operators.plan import EoPlanOperator, savepoint_to_restore
from airflow_provider_eo.operators.restore import EoRestoreOperator, restore_request_key
from airflow_provider_eo.version_compat import AirflowSkipException


def _fake_restore(calls: list[dict[str, Any]]) -> Any:
    def restore(pipeline: Any, ledger: Any, savepoint: str, **kwargs: Any) -> Any:
        calls.append({"savepoint": savepoint, **kwargs})
        return SimpleNamespace(
            repeated=len(calls) > 1,
            summary=lambda: {"pipeline": pipeline.name, "savepoint": savepoint, "repeated": len(calls) > 1},
        )

    return restore


def test_request_key_is_the_dag_run() -> None:
    ti = SimpleNamespace(dag_id="eo_pipeline", run_id="manual__x", try_number=3)
    assert restore_request_key({"ti": ti}) == "eo_pipeline/manual__x"


def test_restore_operator(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(core_restore, "restore_from_savepoint", _fake_restore(calls))
    op = EoRestoreOperator(task_id="r", pipeline=pipeline_ref, savepoint="sp1", allow_non_restored="true")
    assert {"pipeline", "savepoint", "allow_non_restored"} <= set(op.template_fields)
    out = op.execute(context)
    assert out == {"pipeline": "orders", "savepoint": "sp1", "repeated": False}
    assert calls[0]["request_key"] == "d/r1" and calls[0]["allow_non_restored"] is True
    assert calls[0]["actor"].dag_id == "d"


def test_restore_operator_needs_a_name(pipeline_ref: str, context: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="savepoint must name"):
        EoRestoreOperator(task_id="r", pipeline=pipeline_ref, savepoint="None").execute(context)


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), ("None", None), (" sp ", "sp")])
def test_savepoint_to_restore(value: Any, expected: str | None) -> None:
    assert savepoint_to_restore(value) == expected


def test_plan_restores_first_then_plans(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    order: list[str] = []
    fake = _fake_restore(calls)

    def restore(*a: Any, **k: Any) -> Any:
        order.append("restore")
        return fake(*a, **k)

    def plan(*_a: Any, **_k: Any) -> None:
        order.append("plan")

    monkeypatch.setattr(core_restore, "restore_from_savepoint", restore)
    monkeypatch.setattr(core_plan, "plan_checkpoint", plan)
    op = EoPlanOperator(
        task_id="plan", pipeline=pipeline_ref, restore_from="sp1", skip_when_empty=False, preflight=False
    )
    assert op.execute(context) is None
    assert order == ["restore", "plan"] and calls[0]["request_key"] == "d/r1"
    # no restore_from: no restore
    order.clear()
    EoPlanOperator(
        task_id="plan", pipeline=pipeline_ref, restore_from="", skip_when_empty=False, preflight=False
    ).execute(context)
    assert order == ["plan"]


def test_stopped_pipeline_skips_with_the_reason(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def stopped(*_a: Any, **_k: Any) -> None:
        raise PipelineStopped("pipeline 'orders' is stopped by alice: maintenance; `eo resume MODULE:ATTR`")

    monkeypatch.setattr(core_plan, "plan_checkpoint", stopped)
    with pytest.raises(AirflowSkipException, match="stopped by alice: maintenance"):
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref, skip_when_empty=False, preflight=False).execute(
            context
        )


def test_restore_result_is_what_the_core_returns() -> None:
    # The operators return RestoreResult.summary(); keep the agreed name importable.
    assert hasattr(RestoreResult, "summary")
