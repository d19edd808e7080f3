"""Stopped pipelines, backfill checkpoints, savepoint provenance.

- ``eo_pipelines.stopped_at/stopped_by/stop_reason``: stop(-with-savepoint); plan refuses
  new checkpoints while set (the in-flight one may finish); ``resume`` clears them.
- ``eo_pipelines.backfill_of``: for a backfill pipeline (one per live pipeline and target
  topic), the live pipeline whose COMMITTED ranges it re-processes.
- ``eo_pipelines.max_range_span_ms``: the widest ``max_timestamp - min_timestamp`` of any
  prepared range, so the ranges of a time interval are found with one index range scan on
  ``(pipeline_id, min_timestamp)`` (``min_timestamp >= start - span``).
- ``eo_checkpoints.filter_start_ms/filter_end_ms``: a backfill checkpoint reads only the
  records whose Kafka timestamp is in ``[filter_start_ms, filter_end_ms)``.
- ``eo_savepoints.fingerprint/dag_id/run_id``: the settings fingerprint at the savepoint
  and the Airflow run that took it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.add_column(sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("stopped_by", sa.String(500), nullable=True))
        batch.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("backfill_of", sa.String(200), nullable=True))
        batch.add_column(sa.Column("max_range_span_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.add_column(sa.Column("filter_start_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("filter_end_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("eo_savepoints") as batch:
        batch.add_column(sa.Column("fingerprint", sa.String(200), nullable=True))
        batch.add_column(sa.Column("dag_id", sa.String(250), nullable=True))
        batch.add_column(sa.Column("run_id", sa.String(250), nullable=True))
    op.create_index(
        "ix_eo_checkpoint_ranges_min_timestamp",
        "eo_checkpoint_ranges",
        ["pipeline_id", "min_timestamp"],
    )
    # Existing prepared ranges: the widest span so far (NULL when none has timestamps).
    conn = op.get_bind()
    ranges = sa.table(
        "eo_checkpoint_ranges",
        sa.column("pipeline_id", sa.Integer()),
        sa.column("min_timestamp", sa.BigInteger()),
        sa.column("max_timestamp", sa.BigInteger()),
    )
    pipelines = sa.table(
        "eo_pipelines", sa.column("id", sa.Integer()), sa.column("max_range_span_ms", sa.BigInteger())
    )
    spans = conn.execute(
        sa.select(ranges.c.pipeline_id, sa.func.max(ranges.c.max_timestamp - ranges.c.min_timestamp))
        .where(ranges.c.min_timestamp.is_not(None))
        .group_by(ranges.c.pipeline_id)
    ).all()
    for pid, span in spans:
        conn.execute(pipelines.update().where(pipelines.c.id == pid).values(max_range_span_ms=span))


def downgrade() -> None:
    op.drop_index("ix_eo_checkpoint_ranges_min_timestamp", table_name="eo_checkpoint_ranges")
    with op.batch_alter_table("eo_savepoints") as batch:
        batch.drop_column("run_id")
        batch.drop_column("dag_id")
        batch.drop_column("fingerprint")
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.drop_column("filter_end_ms")
        batch.drop_column("filter_start_ms")
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.drop_column("max_range_span_ms")
        batch.drop_column("backfill_of")
        batch.drop_column("stop_reason")
        batch.drop_column("stopped_by")
        batch.drop_column("stopped_at")
