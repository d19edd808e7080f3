"""EoCommitOperator: idempotent on a COMMITTED checkpoint (no Kafka contacted)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowSkipException


def test_committed_checkpoint_is_a_no_op(pipeline_ref: str, context: dict[str, Any]) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
        ledger.mark_committed(pipeline.name, 1)
    out = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id="1").execute(context)
    assert out["state"] == "COMMITTED" and out["published"] == 0 and out["note"] == "already COMMITTED"


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    with pytest.raises(AirflowSkipException):
        EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=None).execute(context)
