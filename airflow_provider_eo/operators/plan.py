"""Plan (or resume) a pipeline's checkpoint from Airflow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.errors import PipelineStopped
from airflow_provider_eo.ledger import CheckpointConflict, CheckpointRecord, InvariantViolation
from airflow_provider_eo.operators import _observe as observe
from airflow_provider_eo.operators._openlineage import OpenLineageMixin
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.operators.restore import restore_request_key
from airflow_provider_eo.operators.savepoint import parse_bool
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.ui.links import LINK_ATTR, EoCheckpointLink
from airflow_provider_eo.version_compat import (
    AirflowException,
    AirflowSkipException,
    BaseOperator,
    Context,
)

# Ranges listed in the XCom; a pipeline with more partitions gets a "... N more" tail.
MAX_XCOM_RANGES = 64


def _refuse_watcher_errors(context: Context, pipeline: str) -> None:
    """Fail the run when every event that started it is an eo asset watcher's error event (the
    source watcher could not load the pipeline in the triggerer): the failure then shows on
    the DAG instead of only in the triggerer's log. A run also started by an event that is
    not an error plans as usual."""
    from collections.abc import Mapping

    from airflow_provider_eo.errors import WatcherSetupError
    from airflow_provider_eo.triggers.checkpoint import watcher_error

    try:
        groups = list((context.get("triggering_asset_events") or {}).values())
    except Exception:  # no asset events in this context (a manual or scheduled run)
        return
    errors, others = [], 0
    for group in groups:
        for event in group:
            extra = event.get("extra") if isinstance(event, Mapping) else getattr(event, "extra", None)
            error = watcher_error(extra)
            if error is None:
                others += 1
            else:
                errors.append(error)
    if errors and not others:
        raise WatcherSetupError(f"pipeline {pipeline}: this run was started by an error event: {errors[-1]}")


class PreflightFailed(AirflowException):
    """The plan task's preflight (``eo doctor``'s Kafka and ledger checks) found a problem
    that would make the checkpoint fail or be refused; nothing was planned. Each finding
    says what to change. Retryable: a broker that was down may answer on the next try."""


class PlanRefused(AirflowException):
    """The ledger refused to plan: another run planned concurrently, or too many
    checkpoints are unfinished. The message says which and what to do."""


def savepoint_to_restore(value: Any) -> str | None:
    """The rendered ``restore_from``: a savepoint name, or None for "no restore"
    (``None``, ``""`` or the ``"None"`` a template renders from a missing value)."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text in ("", "None") else text


def checkpoint_summary(cp: CheckpointRecord, **extra: Any) -> dict[str, Any]:
    """The small XCom describing a checkpoint: its summary, ranges capped at MAX_XCOM_RANGES."""
    return {**cp.summary(max_ranges=MAX_XCOM_RANGES), **extra}


class EoPlanOperator(OpenLineageMixin, PipelineTaskMixin, BaseOperator):
    """Plan the pipeline's next checkpoint, or resume its unfinished one.

    Restart-from-checkpoint is a DAG retry: while a checkpoint is unfinished, every call
    (a retry, a cleared task, the next DAG run) returns that same checkpoint with the
    same ranges. The Airflow task instance is recorded in the ledger as the planner.

    Returns (XCom) ``{"pipeline", "checkpoint_id", "state", "ranges", "records_planned",
    "resumed"}`` (plus ``"restored"``, the restore's summary, when one was asked). When
    there is nothing new to read the task is **skipped**
    (``AirflowSkipException``, like ``ShortCircuitOperator``): with the default trigger
    rule every downstream task skips too, so an idle run is visibly "skipped", not
    "success with nothing done". Set ``skip_when_empty=False`` to succeed with ``None``.

    A **stopped** pipeline (``eo stop``, a savepoint taken with stop) skips the task with
    the ledger's reason, whatever ``skip_when_empty`` says: the run is visibly skipped
    until ``eo resume``. A checkpoint that was in flight when it was stopped still
    resumes and finishes.

    **Restore first**: when ``restore_from`` renders a savepoint name (the pipeline DAG
    passes the run conf's ``restore_from``), the task restores the pipeline from it
    (:func:`~airflow_provider_eo.core.restore.restore_from_savepoint`, refused while a
    checkpoint is unfinished) and then plans from the restored offsets. The restore's
    request key is ``"<dag_id>/<run_id>"``: a retry or cleared task of the same run does
    not restore again.

    :param pipeline: import path ``"module:ATTR"`` of the :class:`~airflow_provider_eo.Pipeline`
        (or of a zero-argument callable returning one). Loaded at execute time. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param skip_when_empty: skip (default) instead of returning ``None`` when nothing is new.
    :param restore_from: a savepoint to restore from before planning; ``None``/``""``
        (default) plans as usual. (templated)
    :param allow_non_restored: with ``restore_from``: accept partitions the savepoint does
        not cover and drop those that no longer exist. (templated)
    :param preflight: before planning, run ``eo doctor``'s ledger and Kafka checks
        (transaction timeout vs the brokers' maximum, source and sink topics and partition
        counts, the transactional-id prefix, the marker group, open transactions); a
        failing check fails the task with :class:`PreflightFailed` naming what to change,
        warnings are logged. Staging and the Spark connector are checked by the prepare.
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "restore_from", "allow_non_restored")
    ui_color = "#e8f4fd"
    operator_extra_links = (EoCheckpointLink(),)

    def __init__(
        self,
        *,
        pipeline: str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        skip_when_empty: bool = True,
        restore_from: str | None = None,
        allow_non_restored: bool | str = False,
        preflight: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.skip_when_empty = skip_when_empty
        self.restore_from = restore_from
        self.allow_non_restored = allow_non_restored
        self.preflight = preflight

    def _preflight(self, pipeline: Pipeline) -> None:
        """``eo doctor`` without the Spark checks: fail on a failing finding, log warnings."""
        from airflow_provider_eo.core.doctor import run_doctor

        report = run_doctor(pipeline, spark=False)
        for f in report.findings:
            if f.severity == "warn":
                self.log.warning("preflight %s: %s -> %s", f.check, f.found, f.change)
        failed = [f for f in report.findings if f.severity == "fail"]
        if failed:
            lines = "\n".join(f"  {f.check}: {f.found}\n    -> {f.change}" for f in failed)
            raise PreflightFailed(
                f"pipeline {pipeline.name!r}: preflight failed, nothing was planned "
                f"(`eo doctor {self.pipeline}` shows the same):\n{lines}"
            )
        self.log.info("pipeline %s: preflight ok (%d checks)", pipeline.name, len(report.findings))

    def execute(self, context: Context) -> dict[str, Any] | None:
        from airflow_provider_eo.core.restore import restore_from_savepoint

        _refuse_watcher_errors(context, self.pipeline)
        pipeline = self.resolve_pipeline()
        if self.preflight:
            self._preflight(pipeline)
        actor = actor_for(context)
        savepoint = savepoint_to_restore(self.restore_from)
        restored: dict[str, Any] | None = None
        with open_ledger(pipeline) as ledger:
            if savepoint is not None:
                result = restore_from_savepoint(
                    pipeline,
                    ledger,
                    savepoint,
                    allow_non_restored=parse_bool(self.allow_non_restored, field="allow_non_restored"),
                    actor=actor,
                    request_key=restore_request_key(context),
                )
                restored = result.summary()
                self.log.info(
                    "pipeline %s: %s savepoint %r: %s",
                    pipeline.name,
                    "already restored (earlier try of this run) from" if result.repeated else "restored from",
                    savepoint,
                    restored,
                )
            try:
                # A data-loss refusal (lost offsets, a ledger behind the sink ...) notifies
                # ``data_loss`` through the coordinator's listener, then propagates.
                cp = observe.coordinator_for(context, pipeline, ledger).plan().checkpoint
            except PipelineStopped as exc:
                raise AirflowSkipException(str(exc)) from exc
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
        setattr(self, LINK_ATTR, (pipeline.name, cp.checkpoint_id))  # the extra link's target
        self.remember_for_lineage(checkpoint=cp)
        summary = checkpoint_summary(cp, resumed=resumed)
        if restored is not None:
            summary["restored"] = restored
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
