"""What an operator reports when a checkpoint changes state: metrics through Airflow's
``Stats`` (:mod:`airflow_provider_eo.metrics`) and the pipeline's notifiers
(:mod:`airflow_provider_eo.notify`). The plan and commit tasks move checkpoints through a
coordinator (:func:`coordinator_for`) whose listeners report each step; the other
operators add one call per moment. Nothing here changes a task's outcome."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.errors import StagingError
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.metrics import AirflowStatsSink, pipeline_metrics
from airflow_provider_eo.notify import notify, notify_committed, notify_refusal
from airflow_provider_eo.operators.base import actor_for, open_ledger
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.version_compat import Context

if TYPE_CHECKING:
    from airflow_provider_eo.core.coordinator import Coordinator

log = logging.getLogger(__name__)


class AirflowListener:
    """A task's coordinator listener (core/coordinator.py): the pipeline's notifiers with the
    task's context. Committed: ``dead_letters`` over the threshold; a failed step: a
    data-loss refusal notifies ``data_loss``, a verified staging mismatch (which aborts the
    checkpoint, core/commit.py) reports the abort. The metrics go through the coordinator's
    metrics listener (:func:`coordinator_for`)."""

    def __init__(self, context: Mapping[str, Any], pipeline: Pipeline) -> None:
        self.context = context
        self.pipeline = pipeline

    def planned(self, cp: CheckpointRecord) -> None:
        """Nothing is notified at plan time."""

    def prepared(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """Nothing is notified at prepare time."""

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """``dead_letters`` when ``cp`` sent more than the pipeline's threshold."""
        notify_committed(self.pipeline, self.context, cp)

    def failed(self, step: str, checkpoint_id: int | None, error: BaseException) -> None:
        """``data_loss`` for a refusal; the abort a staging mismatch made, if it made one."""
        if notify_refusal(self.pipeline, self.context, error, checkpoint_id=checkpoint_id):
            return
        if isinstance(error, StagingError) and checkpoint_id is not None:
            with open_ledger(self.pipeline) as ledger:
                cp = ledger.get(self.pipeline.name, checkpoint_id)
            if cp.state is CheckpointState.ABORTED:
                aborted(self.context, self.pipeline, cp)


def coordinator_for(context: Context, pipeline: Pipeline, ledger: Ledger) -> Coordinator:
    """The coordinator of a task: ``pipeline`` in ``ledger``, acted on by the task instance,
    metrics through Airflow's ``Stats``, the notifiers through :class:`AirflowListener`."""
    # Imported here, not with the module: DAG files import operators, and parsing stays light.
    from airflow_provider_eo.core.coordinator import Coordinator

    return Coordinator(
        pipeline,
        ledger,
        actor_for(context),
        metrics=AirflowStatsSink(),
        listeners=[AirflowListener(context, pipeline)],
    )


def aborted(context: Mapping[str, Any], pipeline: Pipeline, cp: CheckpointRecord) -> None:
    """``cp`` was aborted by this try: ``eo.checkpoint.aborted`` and ``checkpoint_aborted``."""
    pipeline_metrics(pipeline.name).aborted()
    notify(
        pipeline,
        "checkpoint_aborted",
        context,
        checkpoint_id=cp.checkpoint_id,
        reason=cp.abort_reason or "",
        records=cp.records,
    )


def stream_lost(context: Mapping[str, Any], pipeline: Pipeline, run: Mapping[str, Any], reason: str) -> None:
    """A streaming driver's run went silent (LOST): ``stream_stalled``."""
    notify(
        pipeline,
        "stream_stalled",
        context,
        reason=reason,
        stream_run_id=run.get("run_id"),
        host=run.get("host"),
        pid=run.get("pid"),
        log_path=run.get("log_path"),
    )
