"""Fact gathering: what the judges decide on, read from the real services."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_eo.core.doctor.report import Finding
from airflow_provider_eo.errors import PipelineIdentityMismatch, PipelineNameInUse
from airflow_provider_eo.ledger import PipelineRecord
from airflow_provider_eo.pipeline import Pipeline


def _broker_max_timeouts(config: Mapping[str, Any]) -> dict[int, int | None]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.login import check_login

    # A refused login or TLS handshake is named at once (librdkafka would retry it until the
    # time-out and report a transport failure).
    check_login(config)
    client = admin.admin_client(config)
    md = client.list_topics(timeout=15)
    out: dict[int, int | None] = {}
    futures = client.describe_configs(
        [ConfigResource(ResourceType.BROKER, str(b)) for b in sorted(md.brokers)], request_timeout=15
    )
    for res, fut in futures.items():
        try:
            entry = fut.result(timeout=15).get("transaction.max.timeout.ms")
            out[int(res.name)] = int(entry.value) if entry is not None and entry.value else None
        except Exception:  # refused by ACLs: reported as unknown
            out[int(res.name)] = None
    return out


def _live_partitions(config: Mapping[str, Any], topics: Iterable[str]) -> dict[str, list[int] | None]:
    from airflow_provider_eo.kafka import admin

    md = admin.admin_client(config).list_topics(timeout=15)
    out: dict[str, list[int] | None] = {}
    for t in topics:
        meta = md.topics.get(t)
        out[t] = None if meta is None or meta.error is not None else sorted(meta.partitions)
    return out


def _marker_members(config: Mapping[str, Any], group: str) -> list[str]:
    from confluent_kafka import KafkaException

    from airflow_provider_eo.kafka import admin

    deadline = time.monotonic() + 30
    while True:
        fut = admin.admin_client(config).describe_consumer_groups([group], request_timeout=15)[group]
        try:
            desc = fut.result(timeout=15)
            break
        except KafkaException as exc:
            # A group nobody joined yet answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS
            # for a moment on a fresh broker: transient until the deadline.
            if not admin._transient(exc.args[0]) or time.monotonic() >= deadline:
                raise
            time.sleep(0.3)
    return [f"{m.client_id}@{m.host}" for m in desc.members]


def _staging_probe(pipeline: Pipeline) -> str | None:
    """Write and remove a probe file under the pipeline's ``staging_dir``, opened as the
    prepare and the commit open it (:mod:`airflow_provider_eo.staging_fs`); the error text
    (naming where the S3 credentials came from), else None."""
    from airflow_provider_eo import staging_fs

    store = staging_fs.store_for(pipeline)
    try:
        fs, root = store.open(pipeline.staging_dir)
        fs.create_dir(root, recursive=True)
        probe = f"{root.rstrip('/')}/.eo-doctor-{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as f:
            f.write(b"eo doctor\n")
        fs.delete_file(probe)
    except Exception as exc:  # any filesystem error is the finding
        where = ""
        if pipeline.staging_dir.split("://", 1)[0].lower() in staging_fs.S3_SCHEMES:
            where = f" ({store.s3_for(pipeline.staging_dir.split('://', 1)[1].split('/', 1)[0]).describe()})"
        return f"{type(exc).__name__}: {exc}{where}"
    return None


def _cached_connector_jars(spark_version: str) -> list[str]:
    from airflow_provider_eo.stack.paths import state_dir

    out = state_dir() / "jars" / f"spark-sql-kafka-{spark_version}"
    return [str(p) for p in sorted(out.glob("*.jar"))] if (out / ".complete").is_file() else []


def _identity_error(pipeline: Pipeline, record: PipelineRecord | None) -> str | None:
    """The refusal :func:`check_marker_identity` gives, else None. An unregistered pipeline
    has no identity yet: any marker naming one is foreign (a re-created ledger)."""
    from airflow_provider_eo.core.markers import check_marker_identity

    identity = record.identity if record is not None else "(none: not registered in this ledger)"
    try:
        check_marker_identity(pipeline, identity)
    except PipelineIdentityMismatch as exc:
        return str(exc)
    return None


def _same_name_refusal(pipeline: Pipeline, record: PipelineRecord | None) -> str | None:
    """The refusal :func:`check_other_deployments` gives, else None (an unregistered
    pipeline has no identity: every identified marker elsewhere is another deployment's)."""
    from airflow_provider_eo.core.sink_guard import check_other_deployments

    try:
        check_other_deployments(pipeline, record.identity if record is not None else None)
    except PipelineNameInUse as exc:
        return str(exc)
    return None


def _guard(check: str, fn: Any, *args: Any) -> tuple[Any, Finding | None]:
    """Run ``fn``; an error becomes a failed finding of ``check`` (the doctor reports, it does
    not stop at the first broken service)."""
    try:
        return fn(*args), None
    except Exception as exc:  # every failure here is a finding
        return None, Finding(check, "fail", f"{type(exc).__name__}: {exc}", "see the message")
