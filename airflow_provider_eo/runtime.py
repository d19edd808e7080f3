"""The composition root: one way from a pipeline reference to the objects that run it.

Every entry point (an ``eo`` command, an operator, a Spark application, the Structured
Streaming sink) does the same two things before the protocol runs, here and nowhere else:

1. :func:`resolve_pipeline`: load the reference ``MODULE:ATTR`` (or take a pipeline built in
   code), apply the settings of its Airflow connections (the ones an Airflow task handed
   this driver, else the ones read in this process) and, in a task, register its secrets
   with the task log's masker. What differs between entry points is said by arguments:
   which connection ids override the pipeline's, where a hand-off comes from, whether to
   mask.
2. :func:`build_runtime`: the pipeline's stager, the shard runner its commit mode calls for
   (``spark/commit.py: resolve_runner``) and its metrics sink, made once;
   :meth:`Runtime.coordinator` is the core object every step goes through.

Importing this module imports neither Airflow nor Spark: a Spark driver that needs no
connection never loads Airflow, and ``eo --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from airflow_provider_eo import names
from airflow_provider_eo.connections import ConnectionSettings, apply_settings, read_handoff
from airflow_provider_eo.pipeline import Pipeline, is_secret_kafka_setting, load_pipeline

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_eo.core.coordinator import Coordinator
    from airflow_provider_eo.core.metrics import MetricsSink
    from airflow_provider_eo.core.prepare import Stager
    from airflow_provider_eo.core.shard import ShardRunner
    from airflow_provider_eo.ledger import Actor, Ledger

__all__ = [
    "ResolvedPipeline",
    "Runtime",
    "build_runtime",
    "mask_pipeline_secrets",
    "resolve_pipeline",
    "take_handoff",
]

#: ``handoff="env"``: the settings an Airflow task handed this Spark driver, in the private
#: file named by :data:`~airflow_provider_eo.names.CONNECTIONS_FILE_ENV` (read once, deleted).
FROM_ENV = "env"


@dataclasses.dataclass(frozen=True)
class ResolvedPipeline:
    """A pipeline as an entry point runs it, and the connection settings applied to it.

    :param pipeline: the pipeline, its connections applied (no connection id left).
    :param settings: what the connections resolved to (read in this process, else handed
        over; empty when the pipeline names none): what a task hands a Spark driver it
        starts. Secrets included: never log it.
    """

    pipeline: Pipeline
    settings: ConnectionSettings


def take_handoff() -> ConnectionSettings | None:
    """The connection settings an Airflow task handed this driver (client deploy mode), or
    None: the file named by :data:`~airflow_provider_eo.names.CONNECTIONS_FILE_ENV` is read
    and deleted, and the variable removed, so a second call finds nothing."""
    path = os.environ.pop(names.CONNECTIONS_FILE_ENV, None)
    return read_handoff(path) if path else None


def resolve_pipeline(
    source: str | Pipeline,
    *,
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    handoff: ConnectionSettings | Literal["env"] | None = None,
    mask: bool = False,
) -> ResolvedPipeline:
    """``source`` (a ``MODULE:ATTR`` reference, or a pipeline) as an entry point runs it:

    1. a reference is imported (:func:`~airflow_provider_eo.pipeline.load_pipeline`: a clear
       error for a missing module, attribute, or an object that is not a pipeline);
    2. a hand-off is applied: ``handoff`` given, or ``"env"`` for the one this driver's
       environment names (:func:`take_handoff`, taken only after the load succeeded). What
       the task read is in it, so ``kafka_conn_id`` / ``ledger_conn_id`` are not read again;
    3. the connections still named are read here (``kafka_conn_id`` / ``ledger_conn_id``
       when given, else the pipeline's own; ``AIRFLOW_CONN_*`` or the secrets backend of this
       process). Airflow is imported only when there is one to read;
    4. with ``mask``, the secrets are registered with the task log's masker
       (:func:`mask_pipeline_secrets`: an Airflow task's log and rendered fields show ``***``).
    """
    pipeline = load_pipeline(source) if isinstance(source, str) else source
    settings = ConnectionSettings()
    handed = take_handoff() if handoff == FROM_ENV else handoff
    if isinstance(handed, ConnectionSettings):
        pipeline, settings = apply_settings(pipeline, handed), handed
        kafka_conn_id = ledger_conn_id = None  # what the task read is in the hand-off
    if pipeline.connection_ids or kafka_conn_id or ledger_conn_id:
        from airflow_provider_eo.hooks.base import resolve_connections

        pipeline, settings = resolve_connections(
            pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id
        )
    if mask:
        mask_pipeline_secrets(pipeline)
    return ResolvedPipeline(pipeline, settings)


def mask_pipeline_secrets(pipeline: Pipeline) -> None:
    """Register the pipeline's secrets with Airflow's masker, so the task log (and rendered
    fields) show ``***``: the ledger URL's password and the Kafka settings that are secrets
    (``sasl.password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret``, ...)."""
    from sqlalchemy.engine import make_url

    from airflow_provider_eo.version_compat import mask_secret

    try:
        password = make_url(pipeline.ledger_url).password
    except Exception:  # not a URL SQLAlchemy parses: the ledger refuses it later, loudly
        password = None
    if password:
        mask_secret(str(password))
    for key, value in pipeline.kafka.items():
        if value and is_secret_kafka_setting(key):
            mask_secret(str(value))
    for key in ("secret_key", "session_token"):  # the AWS connection's staging credentials
        value = (pipeline.aws_settings or {}).get(key)
        if value:
            mask_secret(str(value))


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What runs one pipeline in one process, built once by :func:`build_runtime`.

    :param pipeline: the pipeline (connections applied, the commit mode in force).
    :param staging: the stager its prepares use (None: this entry point does not prepare).
    :param runner: where its commits run their shards (None: in this process).
    :param metrics: where the protocol's metrics go (None: nowhere).
    """

    pipeline: Pipeline
    staging: Stager | None
    runner: ShardRunner | None
    metrics: MetricsSink | None = None

    @property
    def stager(self) -> Stager:
        """The stager (a runtime built with ``stage=False`` has none: ValueError)."""
        if self.staging is None:
            raise ValueError(f"pipeline {self.pipeline.name!r}: this runtime was built without a stager")
        return self.staging

    def coordinator(
        self, ledger: Ledger, actor: Actor | None = None, *, fallback: Callable[[str], None] | None = None
    ) -> Coordinator:
        """The checkpoint coordinator of this runtime's pipeline on ``ledger`` (the caller
        owns it), with its runner and metrics; ``fallback`` as the coordinator takes it."""
        from airflow_provider_eo.core.coordinator import Coordinator

        return Coordinator(
            self.pipeline, ledger, actor, runner=self.runner, fallback=fallback, metrics=self.metrics
        )


def build_runtime(
    pipeline: Pipeline,
    *,
    spark: SparkSession | None = None,
    commit_mode: str | None = None,
    stage: bool = True,
    app_name: str | None = None,
    ship: Sequence[str] = (),
    metrics: MetricsSink | None = None,
) -> Runtime:
    """The :class:`Runtime` of ``pipeline``: nothing starts here (no Spark session, no
    Kafka client, no ledger connection).

    :param spark: the session to stage and commit on (None: the stager starts one when it
        first prepares, a spark-mode commit uses the running one or starts one).
    :param commit_mode: overrides the pipeline's ``commit_mode`` (``--commit-mode``); an
        invalid value is the pipeline's own error, naming it.
    :param stage: build a :class:`~airflow_provider_eo.spark.stager.SparkStager` (False for
        an entry point that only commits).
    :param app_name: the Spark application name of a session the stager starts.
    :param ship: pipeline references whose modules the stager ships to the executors.
    :param metrics: where the coordinator reports each step (None: nowhere).
    """
    from airflow_provider_eo.spark.commit import resolve_runner

    if commit_mode is not None:
        pipeline = dataclasses.replace(pipeline, commit_mode=commit_mode)  # type: ignore[arg-type]
    staging: Stager | None = None
    if stage:
        from airflow_provider_eo.spark.stager import SparkStager

        staging = SparkStager(spark, app_name=app_name, ship=ship)
    return Runtime(pipeline, staging, resolve_runner(pipeline, spark), metrics)
