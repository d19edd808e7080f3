"""What every eo operator and the sensor share: their common arguments
(:class:`PipelineTaskMixin`) and resolving the pipeline at execute time.

A pipeline is referenced by its import path ``"module:ATTR"`` so that parsing a DAG
imports nothing heavy and touches no Kafka, Spark or ledger. At execute time the
reference is loaded and, when connection ids are given, the Kafka config of a ``kafka``
connection is merged over the pipeline's and the ledger URL of an ``eo_ledger``
connection replaces the pipeline's.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.pipeline import Pipeline, load_pipeline
from airflow_provider_eo.version_compat import AirflowSkipException, Context, mask_secret, task_identity

#: Kafka client settings whose values are secrets (librdkafka names).
SECRET_KAFKA_KEYS = ("password", "secret", "sasl.jaas.config", "sasl.oauthbearer.config")


def mask_pipeline_secrets(pipeline: Pipeline) -> None:
    """Register the pipeline's secrets with Airflow's masker, so the task log (and rendered
    fields) show ``***``: the ledger URL's password and the Kafka settings that are secrets
    (``sasl.password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret``, ...)."""
    from sqlalchemy.engine import make_url

    try:
        password = make_url(pipeline.ledger_url).password
    except Exception:  # not a URL SQLAlchemy parses: the ledger refuses it later, loudly
        password = None
    if password:
        mask_secret(str(password))
    for key, value in pipeline.kafka.items():
        if value and any(marker in str(key).lower() for marker in SECRET_KAFKA_KEYS):
            mask_secret(str(value))


def resolve_pipeline(
    ref: str, *, kafka_conn_id: str | None = None, ledger_conn_id: str | None = None
) -> Pipeline:
    """Load ``ref`` and apply the Airflow connections (when given) over its settings; its
    secrets are masked in the task log from here on (:func:`mask_pipeline_secrets`)."""
    pipeline = load_pipeline(ref)
    if kafka_conn_id:
        from airflow_provider_eo.hooks.kafka import EoKafkaHook

        pipeline = EoKafkaHook(kafka_config_id=kafka_conn_id).apply_to(pipeline)
    if ledger_conn_id:
        from airflow_provider_eo.hooks.ledger import LedgerHook

        url = LedgerHook(eo_ledger_conn_id=ledger_conn_id).get_url()
        pipeline = dataclasses.replace(pipeline, ledger_url=url)
    mask_pipeline_secrets(pipeline)
    return pipeline


def pipeline_overrides(
    pipeline: Pipeline, *, kafka_conn_id: str | None, ledger_conn_id: str | None
) -> str | None:
    """JSON of the settings that came from connections (secrets included: never log it)."""
    doc: dict[str, Any] = {}
    if kafka_conn_id:
        doc["kafka"] = dict(pipeline.kafka)
    if ledger_conn_id:
        doc["ledger_url"] = pipeline.ledger_url
    return json.dumps(doc) if doc else None


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
        """The pipeline with this task's connections applied (see :func:`resolve_pipeline`)."""
        return resolve_pipeline(
            self.pipeline, kafka_conn_id=self.kafka_conn_id, ledger_conn_id=self.ledger_conn_id
        )

    def target_checkpoint(self) -> int:
        """The (rendered) ``checkpoint_id`` as an int; skips the task when the plan had none."""
        return parse_checkpoint_id(self.checkpoint_id, task_id=self.task_id)

    def pipeline_overrides(self, pipeline: Pipeline) -> str | None:
        """JSON of the settings that came from this task's connections (see
        :func:`pipeline_overrides`; secrets included: never log it)."""
        return pipeline_overrides(
            pipeline, kafka_conn_id=self.kafka_conn_id, ledger_conn_id=self.ledger_conn_id
        )
