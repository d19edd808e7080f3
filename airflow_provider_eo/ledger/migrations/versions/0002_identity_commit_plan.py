"""Pipeline identity, pinned transactional-id prefix, frozen commit plans.

- ``eo_pipelines.identity``: a random id made when the ledger registers the pipeline; the
  commit markers carry it, so a re-created ledger (or a second deployment with the same
  pipeline name) is refused instead of trusting another ledger's markers. Existing rows get
  a fresh random identity.
- ``eo_pipelines.transactional_id_prefix``: pinned at the first commit; a committer with
  another prefix is refused (Kafka fences only within one transactional id).
- ``eo_checkpoints.commit_plan``: sink topic, partition count, shard map, prefix and
  marker group frozen when the checkpoint is planned.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.add_column(sa.Column("identity", sa.String(64), nullable=True))
        batch.add_column(sa.Column("transactional_id_prefix", sa.String(200), nullable=True))
    conn = op.get_bind()
    pipelines = sa.table("eo_pipelines", sa.column("id", sa.Integer()), sa.column("identity", sa.String()))
    for (pid,) in conn.execute(sa.select(pipelines.c.id)).all():
        conn.execute(pipelines.update().where(pipelines.c.id == pid).values(identity=uuid.uuid4().hex))
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.alter_column("identity", existing_type=sa.String(64), nullable=False)
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.add_column(sa.Column("commit_plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eo_checkpoints") as batch:
        batch.drop_column("commit_plan")
    with op.batch_alter_table("eo_pipelines") as batch:
        batch.drop_column("transactional_id_prefix")
        batch.drop_column("identity")
