"""EoCommitOperator: idempotent on a COMMITTED checkpoint (no Kafka contacted, nothing
submitted), and where it commits (commit_mode)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.errors import NotPrepared
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.commit import EoCommitOperator, choose_commit_mode, commit_application
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowSkipException


def test_committed_checkpoint_is_a_no_op(pipeline_ref: str, context: dict[str, Any]) -> None:
    _committed(pipeline_ref)
    out = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id="1").execute(context)
    assert out["state"] == "COMMITTED" and out["published"] == 0 and out["note"] == "already COMMITTED"


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    with pytest.raises(AirflowSkipException):
        EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=None).execute(context)


# -- commit_mode ------------------------------------------------------------------------------
def _never() -> str | None:
    raise AssertionError("the Spark connection was looked up")


@pytest.mark.parametrize(
    ("requested", "records", "master", "expected"),
    [
        ("local", 10**9, "spark://m:7077", "local"),
        ("spark", 0, "local[2]", "spark"),
        ("auto", 5000, "spark://m:7077", "spark"),  # 10 x min_records: worth a new application
        ("auto", 4999, "spark://m:7077", "local"),
        ("auto", 500, "spark://m:7077", "local"),
        ("auto", 10**6, "yarn", "spark"),
        ("auto", 10**6, "k8s://https://api:6443", "spark"),
        ("auto", 10**6, "local", "local"),
        ("auto", 10**6, "local[4]", "local"),
        ("auto", 10**6, "local[*]", "local"),
        ("auto", 10**6, None, "local"),  # no Spark connection
    ],
)
def test_choose_commit_mode(requested: str, records: int, master: str | None, expected: str) -> None:
    assert choose_commit_mode(requested, records=records, min_records=500, master=lambda: master) == expected


def test_auto_never_looks_up_the_connection_for_a_small_checkpoint() -> None:
    assert choose_commit_mode("auto", records=10, min_records=500, master=_never) == "local"
    assert choose_commit_mode("local", records=10**9, min_records=0, master=_never) == "local"
    assert choose_commit_mode("spark", records=0, min_records=500, master=_never) == "spark"


def test_unknown_commit_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="commit_mode 'remote'"):
        choose_commit_mode("remote", records=1, min_records=0, master=_never)
    with pytest.raises(ValueError, match="commit_mode 'remote'"):
        EoCommitOperator(task_id="commit", pipeline="m:P", checkpoint_id=1, commit_mode="remote")


def test_commit_mode_is_templated_and_defaults_to_the_pipeline() -> None:
    op = EoCommitOperator(task_id="commit", pipeline="m:P", checkpoint_id=1)
    assert op.commit_mode is None and op.application == ""
    assert {"commit_mode", "conf", "env_vars", "checkpoint_id"} <= set(op.template_fields)
    templated = EoCommitOperator(task_id="c2", pipeline="m:P", checkpoint_id=1, commit_mode="{{ x }}")
    assert templated.commit_mode == "{{ x }}"


def test_commit_application_is_the_package_file() -> None:
    assert commit_application().endswith("airflow_provider_eo/apps/commit.py")


def _committed(pipeline_ref: str) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
        ledger.mark_committed(pipeline.name, 1)


def test_spark_mode_on_a_committed_checkpoint_submits_nothing(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(pipeline_ref)
    monkeypatch.setattr(EoCommitOperator, "_get_hook", lambda self: pytest.fail("spark-submit called"))
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id="1", commit_mode="spark")
    out = op.execute(context)
    assert out["state"] == "COMMITTED" and out["published"] == 0 and out["note"] == "already COMMITTED"
    assert out["commit_mode"] == "spark" and out["publishers"] == []


def test_spark_mode_refuses_an_unprepared_checkpoint_before_submitting(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    monkeypatch.setattr(EoCommitOperator, "_get_hook", lambda self: pytest.fail("spark-submit called"))
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=1, commit_mode="spark")
    with pytest.raises(NotPrepared, match=r"checkpoint 1 is PLANNED, not PREPARED.*Nothing was submitted"):
        op.execute(context)
