"""EoSubmitOperator: idempotent skip, lazy jars, the client-mode environment."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.submit import (
    EoSubmitOperator,
    _merge_csv,
    local_driver_env,
    module_root,
    prepare_application,
)
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowFailException, AirflowSkipException


def test_no_work_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.spark.session as session

    monkeypatch.setattr(session, "connector_jars_csv", lambda: pytest.fail("jars resolved at parse time"))
    op = EoSubmitOperator(task_id="prepare", pipeline="no.such:X", checkpoint_id="{{ x }}")
    assert op.jars is None and op.application == ""
    assert {"pipeline", "checkpoint_id", "jars", "env_vars"} <= set(op.template_fields)


def test_prepare_application_is_the_package_file() -> None:
    path = prepare_application()
    assert path.endswith("airflow_provider_eo/spark/prepare.py")


def test_module_root_and_env(pipeline_ref: str, tmp_path: Any) -> None:
    assert module_root(pipeline_ref) == str(tmp_path)
    env = local_driver_env(pipeline_ref)
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert module_root("airflow_provider_eo.examples.transforms:enrich") is not None


def test_merge_csv() -> None:
    assert _merge_csv("a.jar,b.jar", "b.jar,c.jar") == "a.jar,b.jar,c.jar"
    assert _merge_csv(None, "") is None


def _plan(pipeline: Any) -> Ledger:
    ledger = Ledger(pipeline.ledger_url)
    ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    return ledger


def test_already_prepared_submits_nothing(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with _plan(pipeline) as ledger:
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
    monkeypatch.setattr(EoSubmitOperator, "_get_hook", lambda self: pytest.fail("spark-submit called"))
    op = EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="1")
    assert op.execute(context) == {
        "pipeline": "orders",
        "checkpoint_id": 1,
        "state": "PREPARED",
        "submitted": False,
    }


def test_aborted_fails_without_retry(pipeline_ref: str, context: dict[str, Any]) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with _plan(pipeline) as ledger:
        ledger.abort(pipeline.name, 1, reason="test")
    with pytest.raises(AirflowFailException, match="ABORTED"):
        EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id=1).execute(context)


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    with pytest.raises(AirflowSkipException):
        EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="").execute(context)
