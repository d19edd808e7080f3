"""A pipeline's sink topic as an Airflow ``Asset``, and what each committed checkpoint
tells the DAGs scheduled on it.

The asset's URI is ``kafka://<server>/<topic>``, the scheme of the Kafka provider
(``apache-airflow-providers-apache-kafka``: its ``create_asset`` builds it and its
``sanitize_uri`` checks it). ``<server>`` is one bootstrap server of the cluster, written
the same way every time so that the DAG that commits and the DAGs that wait name the
same asset:

- the **first** server of ``bootstrap.servers`` as written (not sorted: a list's order is
  its author's, and OpenLineage names a Kafka dataset's namespace after one bootstrap
  server the same way);
- without a ``PROTOCOL://`` listener prefix, the host in lower case, and with the port
  Kafka clients default to (``9092``) when none is given.

Everything here runs while a DAG file is parsed: nothing looks up an Airflow connection
or contacts Kafka. A pipeline that names its cluster only through ``kafka_conn_id`` has
no server in code, so its asset needs ``bootstrap=`` (see :func:`sink_asset`).

Each committed checkpoint becomes one asset event whose ``extra`` is
:func:`checkpoint_extra`; a downstream DAG reads it from ``triggering_asset_events``.
Airflow delivers asset events at least once (a task that re-runs after a success emits
again), so a consumer treats ``(pipeline, checkpoint_id)`` as the event's identity.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError, load_pipeline
from airflow_provider_eo.version_compat import Asset

if TYPE_CHECKING:
    from airflow_provider_eo.ledger.records import CheckpointRecord

#: The asset URI scheme of the Kafka provider.
KAFKA_SCHEME = "kafka"
#: The port a Kafka client connects to when a bootstrap server names none.
DEFAULT_KAFKA_PORT = 9092


def asset_server(bootstrap: str) -> str:
    """The ``host:port`` of a Kafka asset URI for a ``bootstrap.servers`` value: its first
    server, without a ``PROTOCOL://`` prefix, host in lower case, port ``9092`` if absent.

    >>> asset_server("SASL_SSL://Broker-1.example:9093, broker-2.example:9093")
    'broker-1.example:9093'
    """
    first = next((s.strip() for s in str(bootstrap).split(",") if s.strip()), "")
    if "://" in first:
        first = first.split("://", 1)[1]
    if not first:
        raise ValueError(
            f"bootstrap servers {bootstrap!r} name no server (expected host:port[,host:port...])"
        )
    parsed = urllib.parse.urlsplit(f"//{first}")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"bootstrap server {first!r} has an invalid port (expected host:port)") from None
    host = (parsed.hostname or "").lower()
    if not host:
        raise ValueError(f"bootstrap server {first!r} names no host (expected host:port)")
    if ":" in host:  # an IPv6 literal keeps its brackets in a URI
        host = f"[{host}]"
    return f"{host}:{port or DEFAULT_KAFKA_PORT}"


def kafka_asset(bootstrap: str, topic: str) -> Asset:
    """The Airflow asset of Kafka topic ``topic`` on the cluster ``bootstrap`` names
    (``kafka://<server>/<topic>``, see :func:`asset_server`), built by the Kafka provider's
    asset factory where it has one. Its name is its URI, as the Kafka provider names it.

    :param bootstrap: the cluster's ``bootstrap.servers`` (one server or a comma-separated list).
    :param topic: the topic.
    """
    topic = str(topic or "").strip()
    if not topic or "/" in topic:
        raise ValueError(f"{topic!r} is not a Kafka topic name (a Kafka asset names one topic)")
    server = asset_server(bootstrap)
    try:
        from airflow.providers.apache.kafka.assets.kafka import create_asset
    except ImportError:  # a Kafka provider without asset support: the same URI by hand
        return Asset(uri=f"{KAFKA_SCHEME}://{server}/{topic}")
    asset: Asset = create_asset(server=server, topic=topic)
    return asset


def sink_asset(pipeline: Pipeline | str, *, bootstrap: str | None = None) -> Asset:
    """The asset of ``pipeline``'s sink topic: the outlet of its commit task, and what a
    downstream DAG is scheduled on (``schedule=[sink_asset(...)]``).

    The server comes from ``bootstrap`` when given, else from the pipeline's own
    ``kafka={"bootstrap.servers": ...}``. A pipeline that names its cluster only through
    ``kafka_conn_id`` needs ``bootstrap``: the connection is not read while a DAG is parsed.
    Give the same value in the DAG that commits and in the DAGs that wait (any server of
    the cluster works as long as every DAG names the same one first).

    :param pipeline: the :class:`~airflow_provider_eo.pipeline.Pipeline`, or its
        ``"module:ATTR"`` reference (imported, and a factory called, right now: keep such a
        module light, as the example's is).
    :param bootstrap: the cluster's bootstrap servers for the URI (only the first is used).
    """
    resolved = load_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    servers = bootstrap or resolved.kafka.get("bootstrap.servers")
    if not servers:
        raise PipelineConfigError(
            f"pipeline {resolved.name!r}: its sink asset needs a Kafka bootstrap server, and the "
            f"pipeline names its cluster only through the connection {resolved.kafka_conn_id!r}, "
            "which is not read while a DAG is parsed. Pass bootstrap='host:port' (a server of "
            "that cluster, the same in every DAG that names this asset), or give the pipeline "
            "kafka={'bootstrap.servers': ...} (the connection's settings still win at run time)."
        )
    return kafka_asset(str(servers), resolved.sink_topic)


def topic_of(asset: Any) -> str | None:
    """The topic of a ``kafka://`` asset; ``None`` for any other outlet."""
    uri = getattr(asset, "uri", None)
    if not isinstance(asset, Asset) or not isinstance(uri, str):
        return None
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme != KAFKA_SCHEME:
        return None
    return parsed.path.strip("/") or None


def topic_outlets(outlets: Iterable[Any], topic: str) -> list[Asset]:
    """The ``kafka://`` assets among ``outlets`` that name ``topic`` (on any server: the
    server in the URI is the DAG author's label of the cluster, the topic is what the task
    writes)."""
    return [a for a in outlets if topic_of(a) == topic]


def checkpoint_extra(
    pipeline: Pipeline,
    cp: CheckpointRecord,
    *,
    sink_topic: str | None = None,
    already_committed: bool = False,
) -> dict[str, Any]:
    """The ``extra`` of the asset event of a COMMITTED checkpoint (JSON-ready).

    ``pipeline``, ``checkpoint_id``, ``sink_topic``; ``records`` published; ``ranges``, the
    source offsets ``[start, end)`` per topic-partition it read; ``dead_letters`` sent to
    ``dead_letter_topic``; ``lineage``, the Airflow task instance the ledger records as its
    committer (``dag_id``, ``run_id``, ``task_id``, ``try_number``); ``ledger_lineage``,
    the ledger's lineage number (it changes on a restore or reset); ``committed_at``; and
    ``already_committed``, true when the emitting task found the checkpoint COMMITTED (a
    retry or re-run: an earlier event may carry the same checkpoint).

    :param pipeline: the pipeline the checkpoint belongs to.
    :param cp: the checkpoint as the ledger shows it after its commit.
    :param sink_topic: the topic it was published to, when not the pipeline's (a backfill's
        target topic).
    :param already_committed: whether this task found it COMMITTED before doing anything.
    """
    return {
        "pipeline": cp.pipeline,
        "checkpoint_id": cp.checkpoint_id,
        "sink_topic": sink_topic or pipeline.sink_topic,
        "records": cp.records,
        "ranges": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                **({"skipped_from": r.skipped_from} if r.skipped_from is not None else {}),
            }
            for r in cp.ranges
        ],
        "dead_letters": cp.dead_letters,
        "dead_letter_topic": pipeline.dead_letter_topic if pipeline.dead_letters_enabled else None,
        "lineage": {
            "dag_id": cp.dag_id,
            "run_id": cp.run_id,
            "task_id": cp.task_id,
            "try_number": cp.try_number,
        },
        "ledger_lineage": cp.lineage,
        "committed_at": cp.committed_at.isoformat() if cp.committed_at else None,
        "already_committed": already_committed,
    }


def emit(context: Mapping[str, Any], assets: Iterable[Asset], extra: Mapping[str, Any]) -> None:
    """Attach ``extra`` to the event Airflow emits for each of ``assets`` (outlets of the
    running task) when the task succeeds."""
    from airflow_provider_eo.version_compat import set_outlet_extra

    for asset in assets:
        set_outlet_extra(context, asset, extra)


__all__ = [
    "DEFAULT_KAFKA_PORT",
    "KAFKA_SCHEME",
    "asset_server",
    "checkpoint_extra",
    "emit",
    "kafka_asset",
    "sink_asset",
    "topic_of",
    "topic_outlets",
]
