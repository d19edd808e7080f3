"""Engine settings: SQLite pragmas, and an unreachable database reported without its password."""

from __future__ import annotations

import pytest

from airflow_provider_eo.ledger import (
    Ledger,
    LedgerUnavailable,
)


def test_ledger_unavailable_redacts_password() -> None:
    with pytest.raises(LedgerUnavailable) as info:
        Ledger("postgresql+psycopg://eo:hunter2@127.0.0.1:1/eo")
    msg = str(info.value)
    assert "hunter2" not in msg
    assert "ledger database at postgresql+psycopg://eo:***@127.0.0.1:1/eo unavailable" in msg
    assert "retry later" in msg


def test_new_sqlite_file_is_created_and_upgraded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sub" / "dir" / "ledger.db"
    ledger = Ledger(f"sqlite:///{path}")
    assert path.exists() and ledger.current_revision() == ledger.head_revision()
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    ledger.close()
