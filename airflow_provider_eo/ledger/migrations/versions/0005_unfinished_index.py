"""Unfinished checkpoints by a partial index.

- ``ix_eo_checkpoints_unfinished``: ``(pipeline_id, checkpoint_id)`` of the checkpoints
  that are PLANNED or PREPARED only. A pipeline holds at most ``max_pending`` of them, so
  listing them (what a streaming application resumes at start) reads a handful of index
  entries however many COMMITTED/ABORTED checkpoints the ledger keeps. Both SQLite and
  PostgreSQL support partial indexes; a query uses it when its WHERE repeats the
  predicate below word for word (see ``ledger/reads.py``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen here: a later change of the states needs a migration of its own.
_UNFINISHED = "state IN ('PLANNED', 'PREPARED')"


def upgrade() -> None:
    op.create_index(
        "ix_eo_checkpoints_unfinished",
        "eo_checkpoints",
        ["pipeline_id", "checkpoint_id"],
        sqlite_where=sa.text(_UNFINISHED),
        postgresql_where=sa.text(_UNFINISHED),
    )


def downgrade() -> None:
    op.drop_index("ix_eo_checkpoints_unfinished", table_name="eo_checkpoints")
