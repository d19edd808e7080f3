"""The ledger's database connection: engine settings, SQLite pragmas, sessions, the clock.

Concurrency, per backend:

1. SQLite: every write transaction starts with ``BEGIN IMMEDIATE`` so writers queue on
   the file lock (``busy_timeout``) instead of failing on a stale WAL snapshot; reads
   use a deferred ``BEGIN``.
2. PostgreSQL (READ COMMITTED): writers that change where the next checkpoint starts
   (plan, abort, restore) lock the pipeline row first, so they see each other's heads;
   planning then moves ``pipelines.last_checkpoint_id`` with a compare-and-set, so two
   planners can never insert the same checkpoint even without that lock. Transitions
   lock only the checkpoint row through their conditional UPDATE: a waiting UPDATE
   re-checks ``state`` after the winner commits and matches nothing. The engine pins
   READ COMMITTED: under a server or database default of REPEATABLE READ or
   SERIALIZABLE that wait would end in a serialization failure, reported as the database
   being unavailable instead of as the ordinary conflict.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import CursorResult, Result, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from airflow_provider_eo.ledger.errors import LedgerUnavailable
from airflow_provider_eo.ledger.urls import check_sqlite_location, redact_text, redact_url, resolve_ledger_url

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: The isolation of every PostgreSQL ledger transaction, whatever the server's default
#: (see the module docstring, case 2).
POSTGRES_ISOLATION = "READ COMMITTED"


def utcnow() -> dt.datetime:
    """The ledger's clock (this host's, in UTC); tests replace it to move time."""
    return dt.datetime.now(dt.timezone.utc)


def rowcount(result: Result[Any]) -> int:
    """Rows matched by an UPDATE/DELETE (the conditional transitions rely on it)."""
    return int(cast("CursorResult[Any]", result).rowcount)


def _install_sqlite_pragmas(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, see _on_begin
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=FULL")  # a committed transition survives power loss
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        readonly = conn.get_execution_options().get("eo_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """An engine with the ledger's connection settings for ``url`` (SQLite or PostgreSQL).

    A SQLite file on a network filesystem is refused before anything is created
    (:class:`~airflow_provider_eo.ledger.urls.LedgerOnNetworkFilesystem`).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if memory:
            engine = create_engine(
                parsed,
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
        else:
            check_sqlite_location(database)  # before anything is created there
            Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _install_sqlite_pragmas(engine, wal=not memory)
        return engine
    return create_engine(parsed, pool_pre_ping=True, isolation_level=POSTGRES_ISOLATION)


class Database:
    """One ledger database: its engine, a read-only view of it, and session scopes.

    Every ledger operation runs in exactly one :meth:`write` or :meth:`read` scope, so a
    transition and its event row commit together; a lost connection surfaces as
    :class:`LedgerUnavailable` with the password masked.

    :param url: SQLAlchemy URL, with password (kept private; :attr:`url` is redacted).
    """

    def __init__(self, url: str) -> None:
        url = resolve_ledger_url(url)  # a relative SQLite file lives in the eo home, not the cwd
        self.raw_url = url
        self.url = redact_url(url)
        self.engine = make_engine(url)
        self._read_engine = self.engine.execution_options(eo_readonly=True)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    def unavailable(self, exc: OperationalError) -> LedgerUnavailable:
        """The error to raise for a driver failure: first line of it, password masked."""
        detail = str(getattr(exc, "orig", exc) or exc).strip().splitlines()
        first = redact_text(detail[0] if detail else type(exc).__name__, self.raw_url)
        return LedgerUnavailable(
            f"ledger database at {self.url} unavailable: {first}; retry later "
            "(every transition is conditional, so retrying a call is safe)"
        )

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite); commits on success."""
        try:
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as exc:
            raise self.unavailable(exc) from exc

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read transaction (deferred ``BEGIN`` on SQLite)."""
        try:
            with Session(self._read_engine, expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as exc:
            raise self.unavailable(exc) from exc
