"""EoAbortOperator: the cases decided by the ledger alone (no Kafka contacted)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.errors import AbortRefused
from airflow_provider_eo.ledger import CheckpointNotFound, Ledger, RangeSpec
from airflow_provider_eo.operators.abort import EoAbortOperator
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowSkipException


def _planned(pipeline_ref: str) -> Ledger:
    pipeline = load_pipeline(pipeline_ref)
    ledger = Ledger(pipeline.ledger_url)
    ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    return ledger


def test_templated_fields() -> None:
    op = EoAbortOperator(task_id="abort", pipeline="m:P", checkpoint_id="{{ x }}", reason="{{ y }}")
    assert {"pipeline", "checkpoint_id", "reason"} <= set(op.template_fields)


def test_aborted_checkpoint_is_a_no_op(pipeline_ref: str, context: dict[str, Any]) -> None:
    with _planned(pipeline_ref) as ledger:
        ledger.abort("orders", 1, reason="first")
    out = EoAbortOperator(task_id="abort", pipeline=pipeline_ref, checkpoint_id="1", reason="again").execute(
        context
    )
    assert out == {"pipeline": "orders", "checkpoint_id": 1, "state": "ABORTED", "abort_reason": "first"}


def test_committed_checkpoint_is_refused(pipeline_ref: str, context: dict[str, Any]) -> None:
    with _planned(pipeline_ref) as ledger:
        ledger.mark_prepared(
            "orders", 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
        ledger.mark_committed("orders", 1)
    op = EoAbortOperator(task_id="abort", pipeline=pipeline_ref, checkpoint_id=1, reason="oops")
    with pytest.raises(AbortRefused, match="COMMITTED"):
        op.execute(context)
    with Ledger(load_pipeline(pipeline_ref).ledger_url) as ledger:
        assert ledger.get("orders", 1).state.value == "COMMITTED"


def test_unknown_checkpoint_is_a_clear_error(pipeline_ref: str, context: dict[str, Any]) -> None:
    _planned(pipeline_ref).close()
    op = EoAbortOperator(task_id="abort", pipeline=pipeline_ref, checkpoint_id=7, reason="x")
    with pytest.raises(CheckpointNotFound, match="checkpoint 7"):
        op.execute(context)


def test_empty_reason_is_refused(pipeline_ref: str, context: dict[str, Any]) -> None:
    op = EoAbortOperator(task_id="abort", pipeline=pipeline_ref, checkpoint_id=1, reason=" ")
    with pytest.raises(ValueError, match="reason"):
        op.execute(context)


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    op = EoAbortOperator(task_id="abort", pipeline=pipeline_ref, checkpoint_id=None, reason="x")  # type: ignore[arg-type]
    with pytest.raises(AirflowSkipException):
        op.execute(context)


@pytest.mark.parametrize("force_live", [False, True])
def test_force_live_reaches_the_abort(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch, force_live: bool
) -> None:
    from airflow_provider_eo.core import abort as core_abort

    seen: dict[str, Any] = {}

    def fake_abort(pipeline: Any, ledger: Ledger, checkpoint_id: int, **kw: Any) -> Any:
        seen.update(kw)
        return ledger.abort(pipeline.name, checkpoint_id, reason=kw["reason"])

    monkeypatch.setattr(core_abort, "abort_checkpoint", fake_abort)
    _planned(pipeline_ref).close()
    op = EoAbortOperator(
        task_id="abort", pipeline=pipeline_ref, checkpoint_id="1", reason="dead worker", force_live=force_live
    )
    assert op.execute(context)["state"] == "ABORTED"
    assert seen["force_live"] is force_live
