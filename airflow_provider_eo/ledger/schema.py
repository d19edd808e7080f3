"""The ledger's schema: Alembic revisions, upgrade/downgrade, and the check made on open."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from airflow_provider_eo.ledger.engine import Database
from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.models import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where a schema is read or migrated, not with the module: the ledger
# package is imported when a DAG file imports an operator, and DAG parsing stays light.

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Two processes creating a fresh PostgreSQL ledger at once: the second waits on this lock.
_MIGRATE_LOCK_KEY = zlib.crc32(b"eo-ledger-migrate")


def _alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The schema revision this package needs."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    if head is None:
        raise LedgerError(f"no ledger migrations found under {MIGRATIONS_DIR}: the package is broken")
    return head


def current_revision(db: Database) -> str | None:
    """The schema revision in the database, None when it has no ledger schema."""
    from alembic.runtime.migration import MigrationContext

    try:
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    except OperationalError as exc:
        raise db.unavailable(exc) from exc


def _migrate(db: Database, fn: Callable[[Config, str], None], revision: str) -> None:
    try:
        with db.engine.begin() as conn:
            if db.dialect == "postgresql":
                # The second of two concurrent creators waits, then finds the schema at head.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK_KEY})")
            fn(_alembic_config(conn), revision)
    except OperationalError as exc:
        raise db.unavailable(exc) from exc


def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate the schema up to ``revision`` (idempotent)."""
    from alembic import command

    _migrate(db, command.upgrade, revision)


def downgrade(db: Database, revision: str = "base") -> None:
    """Migrate the schema down to ``revision``; ``base`` drops every ledger table."""
    from alembic import command

    _migrate(db, command.downgrade, revision)


def prepare_schema(db: Database) -> None:
    """On open with ``create=True``: SQLite is upgraded to head; another database gets the
    schema when it has none, and is refused when it holds an older revision (upgrading a
    shared production database is an explicit step)."""
    if db.dialect == "sqlite":
        upgrade(db)
        return
    current = current_revision(db)
    if current is None:
        upgrade(db)
    elif current != head_revision():
        raise LedgerError(
            f"ledger database at {db.url} has schema revision {current}, this "
            f"airflow-provider-eo needs {head_revision()}: run `eo ledger upgrade "
            "--ledger-url ...` (or Ledger.upgrade()) once, then retry"
        )
