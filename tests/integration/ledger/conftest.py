"""Ledgers on real databases: a SQLite file, and PostgreSQL started by scripts/postgres.sh."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """The run's database with an empty ledger schema (dropped after the test)."""
    from airflow_provider_eo.ledger import Ledger

    ledger = Ledger(pg_database, create=False)
    ledger.downgrade("base")
    ledger.close()
    yield pg_database
    ledger = Ledger(pg_database, create=False)
    ledger.downgrade("base")
    ledger.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("pg_url"))
