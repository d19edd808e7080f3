"""Watch marks: what an Airflow asset watcher of a pipeline last fired for.

``eo_watch_marks`` (pipeline name, watch name, seq, state JSON, fired_at): the source
watcher's "fired at" position and the stream-commit announcer's last announced checkpoint,
kept where a restarted triggerer finds them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eo_watch_marks",
        sa.Column("pipeline", sa.String(200), nullable=False),
        sa.Column("watch", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pipeline", "watch", name="pk_eo_watch_marks"),
    )


def downgrade() -> None:
    op.drop_table("eo_watch_marks")
