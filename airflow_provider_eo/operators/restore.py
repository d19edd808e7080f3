"""Restore a pipeline from a savepoint from Airflow: a recorded lineage break."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.operators.savepoint import parse_bool
from airflow_provider_eo.version_compat import BaseOperator, Context


def restore_request_key(context: Context | dict[str, Any]) -> str:
    """The idempotence key of a restore asked by a DAG run: ``"<dag_id>/<run_id>"``, so
    every try (and a cleared task) of the same run restores at most once."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}"


class EoRestoreOperator(PipelineTaskMixin, BaseOperator):
    """Start the pipeline again from a savepoint's offsets, as a new recorded lineage.

    Calls :func:`airflow_provider_eo.core.restore.restore_from_savepoint`: refused while
    a checkpoint is unfinished; partitions the savepoint lacks, or that no longer exist,
    are refused unless ``allow_non_restored`` (Flink's allowNonRestoredState). The range
    after the savepoint is processed again by the next checkpoints, and the ledger records
    the break with this task instance as who asked.

    Idempotent per DAG run: the request key is ``"<dag_id>/<run_id>"``, so a retry or a
    cleared task returns the first result (``repeated: true``) instead of restoring twice.

    Returns (XCom) :meth:`RestoreResult.summary`.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param savepoint: the savepoint's name. (templated)
    :param allow_non_restored: accept partitions the savepoint does not cover (they start
        by the pipeline's rules) and drop positions of partitions that no longer exist.
        (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    """

    template_fields: Sequence[str] = (*PIPELINE_TEMPLATE_FIELDS, "savepoint", "allow_non_restored")
    ui_color = "#fdf8e8"

    def __init__(
        self,
        *,
        pipeline: str,
        savepoint: str,
        allow_non_restored: bool | str = False,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.savepoint = savepoint
        self.allow_non_restored = allow_non_restored

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_eo.core.restore import restore_from_savepoint

        name = str(self.savepoint or "").strip()
        if not name or name == "None":
            raise ValueError(f"task {self.task_id!r}: savepoint must name a savepoint")
        pipeline = self.resolve_pipeline()
        with open_ledger(pipeline) as ledger:
            result = restore_from_savepoint(
                pipeline,
                ledger,
                name,
                allow_non_restored=parse_bool(self.allow_non_restored, field="allow_non_restored"),
                actor=actor_for(context),
                request_key=restore_request_key(context),
            )
        summary: dict[str, Any] = result.summary()
        self.log.info(
            "pipeline %s: %s savepoint %r: %s",
            pipeline.name,
            "already restored (by an earlier try of this run) from" if result.repeated else "restored from",
            name,
            summary,
        )
        return summary
