"""Migrations on a SQLite file: empty -> head -> base -> head, and no drift from the models."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.ledger.models import VERSION_TABLE, Base

TABLES = {
    "eo_pipelines",
    "eo_lineages",
    "eo_checkpoints",
    "eo_checkpoint_ranges",
    "eo_partition_heads",
    "eo_commit_shards",
    "eo_savepoints",
    "eo_events",
}


def _diff(ledger: Ledger) -> list[object]:
    with ledger.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        return list(compare_metadata(ctx, Base.metadata))


def test_upgrade_downgrade_upgrade(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}", create=False)
    assert ledger.current_revision() is None
    ledger.upgrade()
    assert ledger.current_revision() == ledger.head_revision()
    assert set(inspect(ledger.engine).get_table_names()) >= TABLES
    assert _diff(ledger) == []
    ledger.ensure_pipeline("p", "f")
    ledger.downgrade("base")
    assert ledger.current_revision() is None
    assert not TABLES & set(inspect(ledger.engine).get_table_names())
    ledger.upgrade()
    assert _diff(ledger) == []
    ledger.ensure_pipeline("p", "f")
    ledger.close()
