"""EoPipelineControlOperator (the page's Stop / Resume buttons) and the Checkpoint extra link."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.operators.control import EoPipelineControlOperator
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.ui.links import LINK_ATTR, EoCheckpointLink, checkpoint_page_url
from airflow_provider_eo.version_compat import AirflowFailException


def test_stop_then_resume_is_recorded_and_idempotent(pipeline_ref: str, context: dict[str, Any]) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    stop = EoPipelineControlOperator(task_id="control", pipeline=pipeline_ref, action="stop", reason="")
    assert stop.execute(context)["stopped"] is True
    again = EoPipelineControlOperator(
        task_id="control", pipeline=pipeline_ref, action=" STOP ", reason="later"
    )
    assert again.execute(context)["stopped"] is True  # a retry changes nothing
    with Ledger(pipeline.ledger_url) as ledger:
        record = ledger.get_pipeline(pipeline.name)
        assert record.stopped and record.stop_reason == "airflow:d/r1"  # the first stop's reason stays
    resume = EoPipelineControlOperator(task_id="control", pipeline=pipeline_ref, action="resume")
    assert resume.execute(context)["stopped"] is False
    with Ledger(pipeline.ledger_url) as ledger:
        assert not ledger.get_pipeline(pipeline.name).stopped


def test_unknown_action_fails_without_retry(pipeline_ref: str, context: dict[str, Any]) -> None:
    op = EoPipelineControlOperator(task_id="control", pipeline=pipeline_ref, action="restart")
    with pytest.raises(AirflowFailException, match="action must be one of stop, resume"):
        op.execute(context)


def test_checkpoint_link() -> None:
    link = EoCheckpointLink()
    op = EoPipelineControlOperator(task_id="t", pipeline="m:P", action="stop")
    assert link.get_link(op, ti_key=None) == ""  # no checkpoint: no link
    setattr(op, LINK_ATTR, ("orders eu", 42))
    assert link.get_link(op, ti_key=None).endswith("/eo/?pipeline=orders+eu&checkpoint=42")
    assert checkpoint_page_url("p", None, "http://airflow:8080/") == "http://airflow:8080/eo/?pipeline=p"
