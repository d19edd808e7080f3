"""Source accounting and the pinned staging location.

- ``eo_checkpoints.records_read``: source records the prepare read (counted, never
  ``end - start``); ``records_dropped``: read records no output record names (the
  transform filtered them); ``records_created``: output records without a source position;
  ``dead_letters``: records sent to the dead-letter topic. The audit accounts for every
  source record of a committed range with them. NULL on rows prepared before this revision.
- ``eo_pipelines.staging_dir``: the absolute staging location, pinned at registration like
  the transactional-id prefix (NULL for pipelines registered before: pinned on next use).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COUNTS = ("records_read", "records_dropped", "records_created", "dead_letters")


def upgrade() -> None:
    with op.batch_alter_table("eo_checkpoints") as batch:
        for name in _COUNTS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.add_column(sa.Column("staging_dir", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.drop_column("staging_dir")
    with op.batch_alter_table("eo_checkpoints") as batch:
        for name in reversed(_COUNTS):
            batch.drop_column(name)
