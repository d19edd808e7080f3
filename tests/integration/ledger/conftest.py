"""Ledgers on real databases: a SQLite file, and PostgreSQL started by scripts/postgres.sh."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory


@pytest.fixture
def pg_url(make_ledger: LedgerFactory) -> str:
    """A PostgreSQL database of the test's own without the ledger schema (dropped after it)."""
    return make_ledger.url("postgres", migrated=False)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, make_ledger: LedgerFactory) -> str:
    """A database without the ledger schema, once on SQLite and once on PostgreSQL: the tests
    open it with ``Ledger(url)``, which creates the schema, or test the migrations."""
    return make_ledger.url(request.param, migrated=False)
