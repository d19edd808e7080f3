"""Ledgers on real databases: a SQLite file, and PostgreSQL started by scripts/postgres.sh."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "postgres.sh"


def _parse(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the maintenance database of the local PostgreSQL; stopped at the end when
    this session started it."""
    proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        message = (
            f"could not start PostgreSQL with {SCRIPT} start (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
        pytest.fail(message)
    info = _parse(proc.stdout)
    try:
        yield info["EO_PG_URL"]
    finally:
        if info.get("EO_PG_STARTED") == "1":
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def pg_database(pg_server: str) -> Iterator[str]:
    """A fresh database for this test run, dropped at the end."""
    name = f"eo_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(pg_server).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg_server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


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
