"""Stop or resume a pipeline from Airflow (the "Exactly-once" page's Stop / Resume buttons
trigger the ``eo_control`` DAG that runs this operator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.operators.savepoint import created_by_for
from airflow_provider_eo.version_compat import AirflowFailException, BaseOperator, Context

ACTIONS = ("stop", "resume")


class EoPipelineControlOperator(PipelineTaskMixin, BaseOperator):
    """Stop (plan refuses new checkpoints; the one in flight still finishes) or resume a
    pipeline. Idempotent: a retry or a second stop changes nothing.

    :param pipeline: import path ``module:ATTR`` of the pipeline. (templated)
    :param action: ``stop`` or ``resume``. (templated)
    :param reason: why, kept in the ledger with the stop. (templated)
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "action", "reason")
    ui_color = "#fdf3e8"

    def __init__(
        self,
        *,
        pipeline: str,
        action: str,
        reason: str = "",
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.action = action
        self.reason = reason

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_eo.core.savepoint import resume_pipeline, stop_pipeline

        action = str(self.action).strip().lower()
        if action not in ACTIONS:
            raise AirflowFailException(
                f"task {self.task_id!r}: action must be one of {', '.join(ACTIONS)}, got {self.action!r}"
            )
        pipeline = self.resolve_pipeline()
        actor = actor_for(context)
        with open_ledger(pipeline) as ledger:
            if action == "stop":
                reason = str(self.reason or "") or created_by_for(context)
                record = stop_pipeline(pipeline, ledger, reason=reason, actor=actor)
            else:
                record = resume_pipeline(pipeline, ledger, actor=actor)
        self.log.info(
            "pipeline %s: %s (stopped: %s)",
            pipeline.name,
            "stopped" if record.stopped else "running",
            record.stopped,
        )
        return {
            "pipeline": pipeline.name,
            "action": action,
            "stopped": record.stopped,
            "stopped_by": record.stopped_by,
        }
