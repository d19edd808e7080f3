"""Structured Streaming batches: which query and micro-batch a checkpoint is.

- ``eo_checkpoints.query_id``: the Structured Streaming query (its id from the checkpoint
  location's ``metadata``) whose micro-batch this checkpoint is; NULL for checkpoints the
  pipeline planned itself.
- ``eo_checkpoints.batch_id``: that micro-batch's id. A query re-runs a batch with the same
  id and offsets after a failure; the sink finds the batch's checkpoint by these two.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.add_column(sa.Column("query_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("batch_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.drop_column("batch_id")
        batch.drop_column("query_id")
