"""Commit a PREPARED checkpoint from Airflow: publish its staged output exactly once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.ui.links import LINK_ATTR, EoCheckpointLink
from airflow_provider_eo.version_compat import BaseOperator, Context


class EoCommitOperator(PipelineTaskMixin, BaseOperator):
    """Publish a PREPARED checkpoint in Kafka transactions and mark it COMMITTED.

    Idempotent: committing a COMMITTED checkpoint does nothing, and a retry after any
    crash (even between the Kafka commit and the ledger update) publishes only the
    shards whose commit marker does not show the checkpoint yet. The task instance is
    recorded in the ledger as the committer.

    Returns (XCom) ``{"pipeline", "checkpoint_id", "state", "records", "published",
    "shards_skipped", "note"}``; ``published`` counts records this try produced.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param checkpoint_id: the checkpoint to commit, usually the plan's XCom. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "checkpoint_id")
    ui_color = "#e8fde9"
    operator_extra_links = (EoCheckpointLink(),)

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(
            pipeline=pipeline,
            checkpoint_id=checkpoint_id,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        checkpoint_id = self.target_checkpoint()
        pipeline = self.resolve_pipeline()
        actor = actor_for(context)
        with open_ledger(pipeline) as ledger:
            setattr(self, LINK_ATTR, (pipeline.name, checkpoint_id))  # the extra link's target
            result = commit_checkpoint(pipeline, ledger, checkpoint_id, actor=actor)
        cp = result.checkpoint
        self.log.info(
            "pipeline %s: checkpoint %s %s: %s records published by this try, %s shard(s) "
            "already committed%s",
            pipeline.name,
            checkpoint_id,
            cp.state.value,
            result.published,
            result.shards_skipped,
            f" ({result.note})" if result.note else "",
        )
        return {
            "pipeline": pipeline.name,
            "checkpoint_id": checkpoint_id,
            "state": cp.state.value,
            "records": cp.records,
            "published": result.published,
            "shards_skipped": result.shards_skipped,
            "note": result.note,
        }
