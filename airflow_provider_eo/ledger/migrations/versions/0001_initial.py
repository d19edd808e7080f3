"""The initial ledger schema.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from airflow_provider_eo.ledger.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATES = "state IN ('PLANNED', 'PREPARED', 'COMMITTED', 'ABORTED')"


def upgrade() -> None:
    op.create_table(
        "eo_pipelines",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("fingerprint", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("current_lineage", sa.Integer(), nullable=False),
        sa.Column("last_checkpoint_id", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_eo_pipelines"),
        sa.UniqueConstraint("name", name="uq_eo_pipelines_name"),
    )
    op.create_table(
        "eo_lineages",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("lineage", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("offsets", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["eo_pipelines.id"],
            name="fk_eo_lineages_pipeline_id_eo_pipelines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "lineage", name="pk_eo_lineages"),
    )
    op.create_table(
        "eo_checkpoints",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lineage", sa.Integer(), nullable=False),
        sa.Column("prepared_attempt", sa.String(200), nullable=True),
        sa.Column("staging_location", sa.Text(), nullable=True),
        sa.Column("records", sa.BigInteger(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("shard_counts", sa.JSON(), nullable=True),
        sa.Column("planned_at", UTCDateTime(), nullable=False),
        sa.Column("prepared_at", UTCDateTime(), nullable=True),
        sa.Column("committed_at", UTCDateTime(), nullable=True),
        sa.Column("aborted_at", UTCDateTime(), nullable=True),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("task_id", sa.String(250), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("spark_app_id", sa.String(200), nullable=True),
        sa.Column("commit_owner", sa.String(250), nullable=True),
        sa.Column("commit_lease_until", UTCDateTime(), nullable=True),
        sa.Column("abort_reason", sa.Text(), nullable=True),
        sa.CheckConstraint(STATES, name="ck_eo_checkpoints_state"),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["eo_pipelines.id"],
            name="fk_eo_checkpoints_pipeline_id_eo_pipelines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "checkpoint_id", name="pk_eo_checkpoints"),
    )
    op.create_index(
        "ix_eo_checkpoints_pipeline_state_id",
        "eo_checkpoints",
        ["pipeline_id", "state", "checkpoint_id"],
    )
    op.create_table(
        "eo_checkpoint_ranges",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("min_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("max_timestamp", sa.BigInteger(), nullable=True),
        sa.Column("skipped_from", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("start_offset <= end_offset", name="ck_eo_checkpoint_ranges_bounds"),
        sa.ForeignKeyConstraint(
            ["pipeline_id", "checkpoint_id"],
            ["eo_checkpoints.pipeline_id", "eo_checkpoints.checkpoint_id"],
            name="fk_eo_checkpoint_ranges_checkpoint",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_id", "checkpoint_id", "topic", "partition", name="pk_eo_checkpoint_ranges"
        ),
    )
    op.create_index(
        "ix_eo_checkpoint_ranges_partition",
        "eo_checkpoint_ranges",
        ["pipeline_id", "topic", "partition", "checkpoint_id"],
    )
    op.create_table(
        "eo_partition_heads",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("lineage", sa.Integer(), nullable=False),
        sa.Column("next_start", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["eo_pipelines.id"],
            name="fk_eo_partition_heads_pipeline_id_eo_pipelines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "topic", "partition", name="pk_eo_partition_heads"),
    )
    op.create_table(
        "eo_commit_shards",
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("transactional_id", sa.String(250), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=True),
        sa.Column("producer_epoch", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("records", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("state IN ('PENDING', 'COMMITTED')", name="ck_eo_commit_shards_state"),
        sa.ForeignKeyConstraint(
            ["pipeline_id", "checkpoint_id"],
            ["eo_checkpoints.pipeline_id", "eo_checkpoints.checkpoint_id"],
            name="fk_eo_commit_shards_checkpoint",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "checkpoint_id", "shard", name="pk_eo_commit_shards"),
    )
    op.create_table(
        "eo_savepoints",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("offsets", sa.JSON(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(250), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["eo_pipelines.id"],
            name="fk_eo_savepoints_pipeline_id_eo_pipelines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_eo_savepoints"),
        sa.UniqueConstraint("pipeline_id", "name", name="uq_eo_savepoints_pipeline_id_name"),
    )
    op.create_table(
        "eo_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("pipeline_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=True),
        sa.Column("actor", sa.String(500), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=True),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("task_id", sa.String(250), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["eo_pipelines.id"],
            name="fk_eo_events_pipeline_id_eo_pipelines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_eo_events"),
    )
    op.create_index("ix_eo_events_pipeline_checkpoint", "eo_events", ["pipeline_id", "checkpoint_id"])


def downgrade() -> None:
    op.drop_index("ix_eo_events_pipeline_checkpoint", table_name="eo_events")
    op.drop_table("eo_events")
    op.drop_table("eo_savepoints")
    op.drop_table("eo_commit_shards")
    op.drop_table("eo_partition_heads")
    op.drop_index("ix_eo_checkpoint_ranges_partition", table_name="eo_checkpoint_ranges")
    op.drop_table("eo_checkpoint_ranges")
    op.drop_index("ix_eo_checkpoints_pipeline_state_id", table_name="eo_checkpoints")
    op.drop_table("eo_checkpoints")
    op.drop_table("eo_lineages")
    op.drop_table("eo_pipelines")
