"""Alembic environment of the ledger. Run through ``Ledger.upgrade()``, never a CLI ini file.

The caller passes an open connection in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from airflow_provider_eo.ledger.models import VERSION_TABLE, Base


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "the ledger migrations run through Ledger.upgrade()/downgrade() "
            "(or `eo ledger upgrade`), which pass an open connection"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER needs batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
