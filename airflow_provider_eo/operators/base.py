"""What every eo operator and the sensor share: their common arguments
(:class:`PipelineTaskMixin`) and resolving the pipeline at execute time.

A pipeline is referenced by its import path ``"module:ATTR"`` so that parsing a DAG
imports nothing heavy and touches no Kafka, Spark or ledger. At execute time the
reference is loaded and its connections are read (the task's ``kafka_conn_id`` /
``ledger_conn_id``, else the pipeline's own): the Kafka config of a ``kafka`` connection is
merged over the pipeline's and the ledger URL of an ``eo_ledger`` (or ``postgres``)
connection replaces the pipeline's.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_eo.connections import ConnectionSettings
from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.runtime import mask_pipeline_secrets
from airflow_provider_eo.runtime import resolve_pipeline as _resolve
from airflow_provider_eo.version_compat import AirflowSkipException, Context, task_identity

__all__ = [
    "PIPELINE_TEMPLATE_FIELDS",
    "PipelineTaskMixin",
    "actor_for",
    "mask_pipeline_secrets",
    "open_ledger",
    "parse_checkpoint_id",
    "resolve_pipeline",
    "resolve_pipeline_settings",
]


def resolve_pipeline_settings(
    ref: str, *, kafka_conn_id: str | None = None, ledger_conn_id: str | None = None
) -> tuple[Pipeline, ConnectionSettings]:
    """Load ``ref`` and apply its Airflow connections (``kafka_conn_id`` / ``ledger_conn_id``
    when given, else the pipeline's own); its secrets are masked in the task log from here
    on (:func:`mask_pipeline_secrets`). Also returns the settings read, which a Spark driver
    started by the task is handed (:mod:`airflow_provider_eo.connections`)."""
    resolved = _resolve(ref, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id, mask=True)
    return resolved.pipeline, resolved.settings


def resolve_pipeline(
    ref: str, *, kafka_conn_id: str | None = None, ledger_conn_id: str | None = None
) -> Pipeline:
    """The pipeline of :func:`resolve_pipeline_settings`."""
    return resolve_pipeline_settings(ref, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)[0]


def open_ledger(pipeline: Pipeline) -> Ledger:
    """The pipeline's ledger (SQLite files are created and migrated on first use)."""
    return Ledger(pipeline.ledger_url)


def actor_for(context: Context | dict[str, Any]) -> Actor:
    """The ledger's lineage record for the running task instance (plus host and pid)."""
    return Actor.here(**task_identity(context))


def parse_checkpoint_id(value: Any, *, task_id: str) -> int:
    """The checkpoint id given (often a rendered template); skip when the plan had none."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        raise AirflowSkipException(f"{task_id}: no checkpoint to work on (the plan found nothing new)")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{task_id}: checkpoint_id must be an integer (or a template rendering one), got {value!r}"
        ) from None


# Templated arguments every eo task has; the tasks that work on one checkpoint add
# "checkpoint_id".
PIPELINE_TEMPLATE_FIELDS: tuple[str, ...] = ("pipeline", "kafka_conn_id", "ledger_conn_id")


class PipelineTaskMixin:
    """The arguments shared by the plan, submit and commit operators and the checkpoint
    sensor: the pipeline reference, the connections applied over it, and (except for the
    plan) the checkpoint to work on. Mixed in before the Airflow base class.

    Each task's ``__init__`` keeps its keyword-only signature and documents these
    arguments; it stores them with :meth:`_set_pipeline_args` (no work, no imports).
    """

    task_id: str
    pipeline: str
    checkpoint_id: int | str | None
    kafka_conn_id: str | None
    ledger_conn_id: str | None

    def _set_pipeline_args(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str | None = None,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.kafka_conn_id = kafka_conn_id
        self.ledger_conn_id = ledger_conn_id

    def resolve_pipeline(self) -> Pipeline:
        """The pipeline with its connections applied (see :func:`resolve_pipeline_settings`);
        the settings read are kept for :meth:`pipeline_overrides`."""
        pipeline, settings = resolve_pipeline_settings(
            self.pipeline, kafka_conn_id=self.kafka_conn_id, ledger_conn_id=self.ledger_conn_id
        )
        self._eo_connection_settings = settings
        return pipeline

    def target_checkpoint(self) -> int:
        """The (rendered) ``checkpoint_id`` as an int; skips the task when the plan had none."""
        return parse_checkpoint_id(self.checkpoint_id, task_id=self.task_id)

    def ledger_connection_id(self) -> str | None:
        """The ledger connection this task reads (its ``ledger_conn_id``, else the pipeline's
        own, as :meth:`resolve_pipeline` found it): what a trigger is given instead of a URL
        with a password."""
        settings: ConnectionSettings | None = getattr(self, "_eo_connection_settings", None)
        if settings is not None and settings.ledger_conn_id:
            return settings.ledger_conn_id
        return self.ledger_conn_id or None

    def pipeline_overrides(self, pipeline: Pipeline) -> ConnectionSettings | None:
        """The settings :meth:`resolve_pipeline` read from connections (``None`` when the
        pipeline names none), to hand to the Spark driver; secrets included: never log them."""
        settings: ConnectionSettings | None = getattr(self, "_eo_connection_settings", None)
        return settings or None
