"""Frozen commit plans and the pinned transactional-id prefix on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import null, update

from airflow_provider_eo.ledger import CommitPlan, Ledger, RangeSpec
from airflow_provider_eo.ledger.models import Checkpoint
from airflow_provider_eo.ledger.pipelines import TransactionalIdPrefixMismatch

P = "planned"


def _plan(shards: int, prefix: str = "eo") -> CommitPlan:
    return CommitPlan("out", 3, prefix, f"eo-marker.{P}", tuple(p % shards for p in range(3)))


def test_plan_pin_and_freeze(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(P, "fp")
        assert ledger.plan(P, [RangeSpec("t", 0, 0, 10)], commit_plan=_plan(3)).commit_plan == _plan(3)
        assert ledger.get_pipeline(P).transactional_id_prefix == "eo"
        with pytest.raises(TransactionalIdPrefixMismatch, match="'other'"):
            ledger.pin_transactional_id_prefix(P, "other")
        # A row from before revision 0002 (SQL NULL) and one holding a JSON null both freeze.
        for empty in (null(), None):
            with ledger._db.write() as s:
                s.execute(update(Checkpoint).values(commit_plan=empty))
            assert ledger.get(P, 1).commit_plan is None
            assert ledger.freeze_commit_plan(P, 1, _plan(1)).commit_plan == _plan(1)
            assert ledger.freeze_commit_plan(P, 1, _plan(3)).commit_plan == _plan(1)
