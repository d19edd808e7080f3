"""EoPlanOperator: skip on nothing new, typed refusal, lineage (plan_checkpoint faked:
planning itself needs Kafka and is covered by the Airflow integration tests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_eo.core import coordinator as core_plan  # the plan step the task calls
from airflow_provider_eo.core import doctor as core_doctor
from airflow_provider_eo.core.doctor import DoctorReport, Finding
from airflow_provider_eo.ledger import CheckpointConflict, InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.operators.plan import EoPlanOperator, PlanRefused, PreflightFailed
from airflow_provider_eo.ui.links import EoCheckpointLink
from airflow_provider_eo.version_compat import AirflowSkipException


def test_no_work_at_construction() -> None:
    op = EoPlanOperator(task_id="plan", pipeline="no.such.module:X", kafka_conn_id="nope")
    assert op.template_fields == (
        "pipeline",
        "kafka_conn_id",
        "ledger_conn_id",
        "restore_from",
        "allow_non_restored",
    )


def test_nothing_new_skips(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_plan, "plan_checkpoint", lambda *_a, **_k: None)
    with pytest.raises(AirflowSkipException, match="nothing new"):
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref, preflight=False).execute(context)
    op = EoPlanOperator(task_id="p", pipeline=pipeline_ref, skip_when_empty=False, preflight=False)
    assert op.execute(context) is None


@pytest.mark.parametrize(
    "error",
    [
        CheckpointConflict("another planner", pipeline="orders", checkpoint_id=4),
        InvariantViolation("too many unfinished"),
    ],
)
def test_ledger_refusal_is_typed(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def refuse(*_a: Any, **_k: Any) -> None:
        raise error

    monkeypatch.setattr(core_plan, "plan_checkpoint", refuse)
    with pytest.raises(PlanRefused, match="orders"):
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref, preflight=False).execute(context)


def test_xcom_summary_and_lineage(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_plan(pipeline: Any, ledger: Ledger, *, actor: Any, **_: Any) -> Any:
        seen["actor"] = actor
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        return ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 7), RangeSpec("in", 1, 3, 5)], actor=actor)

    monkeypatch.setattr(core_plan, "plan_checkpoint", fake_plan)
    op = EoPlanOperator(task_id="plan", pipeline=pipeline_ref, preflight=False)
    out = op.execute(context)
    # The Checkpoint extra link (computed by Airflow right after execute) points at it.
    assert EoCheckpointLink().get_link(op, ti_key=None).endswith("/eo/?pipeline=orders&checkpoint=1")
    expected = {
        "pipeline": "orders",
        "checkpoint_id": 1,
        "state": "PLANNED",
        "ranges": ["in[0]:0-7", "in[1]:3-5"],
        "records_planned": 9,
        "resumed": False,
    }
    assert {k: out[k] for k in expected} == expected
    assert json.loads(json.dumps(out)) == out  # an XCom: JSON all the way down
    actor = seen["actor"]
    assert (actor.dag_id, actor.run_id, actor.task_id, actor.try_number) == ("d", "r1", "eo.x", 1)


def test_preflight_failure_stops_before_planning(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    planned: list[object] = []
    report = DoctorReport(
        "orders",
        (
            Finding("ledger", "ok", "reachable"),
            Finding("open-transactions", "warn", "open on sink[0]", "run `eo recover`"),
            Finding("sink-topic", "fail", "sink topic 'x' does not exist", "create it"),
        ),
    )
    monkeypatch.setattr(
        core_doctor, "run_doctor", lambda *_a, **kw: report if kw == {"spark": False} else None
    )
    monkeypatch.setattr(core_plan, "plan_checkpoint", lambda *a, **_k: planned.append(a))
    with pytest.raises(
        PreflightFailed,
        match=r"(?s)preflight failed, nothing was planned.*sink-topic: sink topic 'x'.*-> create it",
    ):
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref).execute(context)
    assert planned == []
    ok = DoctorReport(
        "orders", (Finding("open-transactions", "warn", "open on sink[0]", "run `eo recover`"),)
    )
    monkeypatch.setattr(core_doctor, "run_doctor", lambda *_a, **_k: ok)
    monkeypatch.setattr(core_plan, "plan_checkpoint", lambda *a, **_k: None)
    with pytest.raises(AirflowSkipException):  # warnings do not stop the plan
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref).execute(context)
