"""Stream runs: one row per run of a pipeline's streaming application.

- ``eo_stream_runs``: run id, host and pid, heartbeat (database clock), state
  (RUNNING/ENDED/FAILED/LOST), summary or error, a stop request, the Airflow task that
  started it and a detached driver's log file. At most one RUNNING run with a fresh
  heartbeat per pipeline; ``EoStreamOperator(deferrable=True)`` tracks a detached driver
  through it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "eo_stream_runs",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "pipeline_id",
            sa.Integer(),
            sa.ForeignKey(
                "eo_pipelines.id", ondelete="CASCADE", name="fk_eo_stream_runs_pipeline_id_eo_pipelines"
            ),
            nullable=False,
        ),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("commit_mode", sa.String(16), nullable=False),
        sa.Column("heartbeat_s", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stop_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stop_requested_by", sa.String(500), nullable=True),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("task_id", sa.String(250), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_eo_stream_runs"),
        sa.UniqueConstraint("run_id", name="uq_eo_stream_runs_run_id"),
    )
    op.create_index("ix_eo_stream_runs_pipeline_state", "eo_stream_runs", ["pipeline_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_eo_stream_runs_pipeline_state", table_name="eo_stream_runs")
    op.drop_table("eo_stream_runs")
