"""Migrations on the real engines: empty -> head -> base -> head, no drift from the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.ledger.models import VERSION_TABLE, Base


def _drift(ledger: Ledger) -> list[object]:
    with ledger.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        return list(compare_metadata(ctx, Base.metadata))


def test_upgrade_downgrade_upgrade(ledger_url: str) -> None:
    ledger = Ledger(ledger_url, create=False)
    assert ledger.current_revision() is None
    ledger.upgrade()
    assert ledger.current_revision() == ledger.head_revision()
    assert _drift(ledger) == []
    ledger.ensure_pipeline("p", "f")
    ledger.plan("p", [RangeSpec("t", 0, 0, 1)])
    ledger.downgrade("base")
    assert ledger.current_revision() is None
    left = [t for t in inspect(ledger.engine).get_table_names() if t.startswith("eo_")]
    assert left in ([], [VERSION_TABLE])
    ledger.upgrade()
    assert _drift(ledger) == []
    assert ledger.list_pipelines() == []
    ledger.close()


def test_create_true_makes_schema_once(ledger_url: str) -> None:
    first = Ledger(ledger_url)
    second = Ledger(ledger_url)
    assert first.current_revision() == second.current_revision() == first.head_revision()
    first.close()
    second.close()
