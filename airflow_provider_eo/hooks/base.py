"""Read a pipeline's Airflow connections: the one place a connection id becomes settings.

Used by the operators (in the task), the ``eo`` commands and a Spark driver in cluster deploy
mode (which has no hand-off from a task). Connections are looked up the way Airflow does in
that process: in a task through the API server, elsewhere through the configured secrets
backend and ``AIRFLOW_CONN_<ID>`` environment variables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from airflow_provider_eo.connections import ConnectionSettings, apply_settings
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.pipeline import Pipeline

__all__ = ["read_connections", "resolve_connections"]

_T = TypeVar("_T")


def read_connections(
    pipeline: Pipeline,
    *,
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    aws_conn_id: str | None = None,
) -> ConnectionSettings:
    """The settings of the connections ``pipeline`` reads: ``kafka_conn_id`` /
    ``ledger_conn_id`` / ``aws_conn_id`` when given (an operator's arguments), else the
    pipeline's own."""
    kafka_id = kafka_conn_id or pipeline.kafka_conn_id
    ledger_id = ledger_conn_id or pipeline.ledger_conn_id
    aws_id = aws_conn_id or pipeline.aws_conn_id
    kafka: dict[str, object] = {}
    url: str | None = None
    if kafka_id:
        from airflow_provider_eo.hooks.kafka import EoKafkaHook

        hook = EoKafkaHook(kafka_config_id=kafka_id)
        kafka = dict(_lookup(pipeline, kafka_id, lambda: hook.apply_to(pipeline)).kafka)
    if ledger_id:
        from airflow_provider_eo.hooks.ledger import LedgerHook

        url = _lookup(pipeline, ledger_id, lambda: LedgerHook(ledger_id, create=False).get_url())
    aws: dict[str, object] = {}
    if aws_id:
        aws = _lookup(pipeline, aws_id, lambda: aws_staging_settings(pipeline, aws_id))
    return ConnectionSettings(
        kafka_conn_id=kafka_id or None,
        kafka=kafka,
        ledger_conn_id=ledger_id or None,
        ledger_url=url,
        aws_conn_id=aws_id or None,
        aws=aws,
    )


def aws_staging_settings(pipeline: Pipeline, conn_id: str) -> dict[str, object]:
    """The S3 settings of the Airflow ``aws`` connection ``conn_id``, read with the Amazon
    provider's hook (so role assumption, profiles and its ``extra`` work as in Airflow):
    credentials, region, the S3 endpoint and path-style addressing
    (``extra: {"service_config": {"s3": {"addressing_style": "path"}}}``)."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as exc:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: aws_conn_id={conn_id!r} needs the Amazon provider "
            "(pip install apache-airflow-providers-amazon); or give the staging credentials in "
            "the AWS_* environment instead"
        ) from exc
    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    wrapper = hook.conn_config
    creds = hook.get_credentials()
    s3_config = (getattr(wrapper, "service_config", None) or {}).get("s3") or {}
    endpoint = s3_config.get("endpoint_url") or getattr(wrapper, "endpoint_url", None)
    style = s3_config.get("addressing_style")
    return {
        "access_key": creds.access_key,
        "secret_key": creds.secret_key,
        "session_token": creds.token,
        "region": getattr(wrapper, "region_name", None),
        "endpoint": endpoint,
        "path_style": None if style is None else str(style == "path").lower(),
    }


def resolve_connections(
    pipeline: Pipeline,
    *,
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    aws_conn_id: str | None = None,
) -> tuple[Pipeline, ConnectionSettings]:
    """``pipeline`` with its connections applied (see :func:`read_connections`), and the
    settings read (to hand to a Spark driver)."""
    settings = read_connections(
        pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id, aws_conn_id=aws_conn_id
    )
    return apply_settings(pipeline, settings), settings


def _lookup(pipeline: Pipeline, conn_id: str, read: Callable[[], _T]) -> _T:
    """``read()``, with "connection not defined" turned into an error naming the pipeline,
    the connection and where it may come from."""
    try:
        return read()
    except ConfigError:
        raise
    except Exception as exc:
        if type(exc).__name__ != "AirflowNotFoundException":
            raise
        raise ConfigError(
            f"pipeline {pipeline.name!r}: Airflow connection {conn_id!r} is not defined here; "
            "create it (Admin > Connections, `airflow connections add`, the secrets backend) or "
            f"set AIRFLOW_CONN_{conn_id.upper()} in this process's environment"
        ) from exc
