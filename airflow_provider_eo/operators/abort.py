"""Abort an unfinished checkpoint from Airflow, safely: its range is replanned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.operators import _observe as observe
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.version_compat import BaseOperator, Context


class EoAbortOperator(PipelineTaskMixin, BaseOperator):
    """Abort a PLANNED or PREPARED checkpoint so the next plan reads its range again.

    Safe against a live committer: it is refused while one holds the checkpoint's commit
    lease, every commit shard's transactional id is fenced before the commit markers are
    read, and a checkpoint a shard already published is refused (see
    :mod:`airflow_provider_eo.core.abort`). Idempotent: aborting an ABORTED checkpoint
    does nothing; a COMMITTED one is refused (AbortRefused). The task instance is
    recorded in the ledger with the reason.

    Returns (XCom) ``{"pipeline", "checkpoint_id", "state", "abort_reason"}``.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param checkpoint_id: the checkpoint to abort. (templated)
    :param reason: why; recorded in the ledger's ``abort_reason`` and event. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param force_live: take the commit lease of a committer known to be dead while its lease
        runs (``eo abort --force-live``); a live committer would be fenced and its commit
        fail. Default ``False``: refused until the lease runs out.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "checkpoint_id", "reason")
    ui_color = "#fde8e8"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str,
        reason: str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        force_live: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.reason = reason
        self.force_live = force_live
        self._set_pipeline_args(
            pipeline=pipeline,
            checkpoint_id=checkpoint_id,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_eo.core.abort import abort_checkpoint

        if not str(self.reason).strip():
            raise ValueError(f"task {self.task_id!r}: reason must not be empty (it is recorded)")
        checkpoint_id = self.target_checkpoint()
        pipeline = self.resolve_pipeline()
        with open_ledger(pipeline) as ledger:
            was = ledger.get(pipeline.name, checkpoint_id).state
            cp = abort_checkpoint(
                pipeline,
                ledger,
                checkpoint_id,
                reason=str(self.reason),
                actor=actor_for(context),
                force_live=self.force_live,
            )
        self.log.info(
            "pipeline %s: checkpoint %s %s (%s)",
            pipeline.name,
            checkpoint_id,
            cp.state.value,
            cp.abort_reason,
        )
        if was is not CheckpointState.ABORTED and cp.state is CheckpointState.ABORTED:
            observe.aborted(context, pipeline, cp)  # metrics, notifiers (never raises)
        return {
            "pipeline": pipeline.name,
            "checkpoint_id": checkpoint_id,
            "state": cp.state.value,
            "abort_reason": cp.abort_reason,
        }
