"""Plan (or resume) a pipeline's checkpoint from Airflow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.core.plan import plan_checkpoint
from airflow_provider_eo.ledger import CheckpointConflict, CheckpointRecord, InvariantViolation
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.version_compat import (
    AirflowException,
    AirflowSkipException,
    BaseOperator,
    Context,
)

# Ranges listed in the XCom; a pipeline with more partitions gets a "... N more" tail.
MAX_XCOM_RANGES = 64


class PlanRefused(AirflowException):
    """The ledger refused to plan: another run planned concurrently, or too many
    checkpoints are unfinished. The message says which and what to do."""


def checkpoint_summary(cp: CheckpointRecord, **extra: Any) -> dict[str, Any]:
    """The small XCom describing a checkpoint: its summary, ranges capped at MAX_XCOM_RANGES."""
    return {**cp.summary(max_ranges=MAX_XCOM_RANGES), **extra}


class EoPlanOperator(PipelineTaskMixin, BaseOperator):
    """Plan the pipeline's next checkpoint, or resume its unfinished one.

    Restart-from-checkpoint is a DAG retry: while a checkpoint is unfinished, every call
    (a retry, a cleared task, the next DAG run) returns that same checkpoint with the
    same ranges. The Airflow task instance is recorded in the ledger as the planner.

    Returns (XCom) ``{"pipeline", "checkpoint_id", "state", "ranges", "records_planned",
    "resumed"}``. When there is nothing new to read the task is **skipped**
    (``AirflowSkipException``, like ``ShortCircuitOperator``): with the default trigger
    rule every downstream task skips too, so an idle run is visibly "skipped", not
    "success with nothing done". Set ``skip_when_empty=False`` to succeed with ``None``.

    :param pipeline: import path ``"module:ATTR"`` of the :class:`~airflow_provider_eo.Pipeline`
        (or of a zero-argument callable returning one). Loaded at execute time. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param skip_when_empty: skip (default) instead of returning ``None`` when nothing is new.
    """

    template_fields: Sequence[str] = PIPELINE_TEMPLATE_FIELDS
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        pipeline: str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        skip_when_empty: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.skip_when_empty = skip_when_empty

    def execute(self, context: Context) -> dict[str, Any] | None:
        pipeline = self.resolve_pipeline()
        actor = actor_for(context)
        with open_ledger(pipeline) as ledger:
            try:
                cp = plan_checkpoint(pipeline, ledger, actor=actor)
            except CheckpointConflict as exc:
                raise PlanRefused(
                    f"pipeline {pipeline.name!r}: another run planned checkpoint "
                    f"{exc.checkpoint_id} at the same moment ({exc}). Run the pipeline DAG with "
                    "max_active_runs=1; a retry of this task resumes that checkpoint."
                ) from exc
            except InvariantViolation as exc:
                raise PlanRefused(f"pipeline {pipeline.name!r}: the ledger refused the plan: {exc}") from exc
        if cp is None:
            message = f"pipeline {pipeline.name!r}: nothing new to read in {list(pipeline.source_topics)}"
            if self.skip_when_empty:
                raise AirflowSkipException(message)
            self.log.info("%s", message)
            return None
        resumed = not (cp.run_id == actor.run_id and cp.try_number == actor.try_number)
        summary = checkpoint_summary(cp, resumed=resumed)
        self.log.info(
            "pipeline %s: %s checkpoint %s (%s), %s offsets planned: %s",
            pipeline.name,
            "resuming" if resumed else "planned",
            cp.checkpoint_id,
            cp.state.value,
            summary["records_planned"],
            ", ".join(summary["ranges"]),
        )
        return summary
