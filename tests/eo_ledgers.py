"""The ledger factory behind the ``make_ledger`` fixture (tests/conftest.py): fresh SQLite or
PostgreSQL ledgers for one test, closed and dropped after it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_provider_eo.ledger import Ledger

LedgerKind = Literal["sqlite", "postgres"]
#: The PostgreSQL server a database is made on: its maintenance URL, or a callable that
#: (re)starts it and returns that URL (called again before the drop: a test may stop it).
PgServer = str | Callable[[], str]


def migrated_template(path: Path) -> Path:
    """A SQLite ledger file at ``path`` with every migration applied: SQLite ledgers are
    copies of it (a copy takes a millisecond, the migrations a few hundred)."""
    Ledger(f"sqlite:///{path}").close()
    return path


class LedgerFactory:
    """Fresh ledgers for one test: ``make_ledger()`` opens one, ``make_ledger.url()`` makes a
    database and returns its URL. After the test every ledger it opened is closed and every
    PostgreSQL database dropped; SQLite files live in the test's ``tmp_path``."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, template: Path) -> None:
        self._request = request
        self._tmp_path = tmp_path
        self._template = template
        self._opened: list[Ledger] = []
        self._databases: list[tuple[PgServer, str]] = []

    def url(
        self, kind: LedgerKind = "sqlite", *, migrated: bool = True, server: PgServer | None = None
    ) -> str:
        """The URL of a new database of ``kind``: with the ledger's schema when ``migrated``,
        else empty (for tests of the migrations or of ``Ledger(url)`` creating the schema).

        :param server: PostgreSQL only; default the session's server (the ``pg_server`` fixture).
        """
        if kind == "sqlite":
            path = self._tmp_path / f"ledger-{uuid.uuid4().hex[:8]}.db"
            if migrated:
                shutil.copyfile(self._template, path)
            return f"sqlite:///{path}"
        if server is None:
            server = str(self._request.getfixturevalue("pg_server"))
        server_url = server() if callable(server) else server
        name = f"eo_ledger_{uuid.uuid4().hex[:10]}"
        _database(server_url, f'CREATE DATABASE "{name}"')
        self._databases.append((server, name))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        if migrated:
            Ledger(url).close()
        return url

    def __call__(
        self,
        kind: LedgerKind = "sqlite",
        *,
        url: str | None = None,
        pipeline: str | None = None,
        fingerprint: str = "fp",
    ) -> Ledger:
        """An open ledger on a new database of ``kind`` (or on ``url``, whose schema is created
        if missing), with ``pipeline`` registered under ``fingerprint`` when given."""
        ledger = Ledger(url) if url is not None else Ledger(self.url(kind), create=False)
        self._opened.append(ledger)
        if pipeline is not None:
            ledger.ensure_pipeline(pipeline, fingerprint)
        return ledger

    def close(self) -> None:
        """Close the opened ledgers, then drop the PostgreSQL databases (forcing out the
        connections a test left behind)."""
        for ledger in self._opened:
            ledger.close()
        for server, name in self._databases:
            _database(
                server() if callable(server) else server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
            )


def _database(server_url: str, statement: str) -> None:
    """Run ``statement`` (CREATE/DROP DATABASE) on the server's maintenance database."""
    admin = create_engine(make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        admin.dispose()
