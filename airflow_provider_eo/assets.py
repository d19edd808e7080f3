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
from typing import Any

from airflow_provider_eo.checkpoint_event import checkpoint_extra
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError, load_pipeline
from airflow_provider_eo.version_compat import Asset

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


def sink_asset(
    pipeline: Pipeline | str,
    *,
    bootstrap: str | None = None,
    stream_commits: bool = False,
    ledger_conn_id: str | None = None,
    poll_interval: float = 5.0,
) -> Asset:
    """The asset of ``pipeline``'s sink topic: the outlet of its commit task, and what a
    downstream DAG is scheduled on (``schedule=[sink_asset(...)]``).

    With ``stream_commits=True`` the asset also carries an ``AssetWatcher`` running
    :class:`~airflow_provider_eo.triggers.stream.EoStreamCommitsTrigger`: each checkpoint a
    streaming application commits itself (``commit="inline"``) becomes an event on it, with
    the checkpoint in ``extra["payload"]`` (see :func:`event_checkpoint`). Airflow keeps an
    asset's watchers as the DAG file parsed last declares them, so build the asset the same
    way (``stream_commits`` and its settings) in every DAG file that names it: the commit
    DAG's outlet, the stream DAG, the downstream DAGs. The watcher runs while a DAG
    scheduled on the asset is active.

    The server comes from ``bootstrap`` when given, else from the pipeline's own
    ``kafka={"bootstrap.servers": ...}``. A pipeline that names its cluster only through
    ``kafka_conn_id`` needs ``bootstrap``: the connection is not read while a DAG is parsed.
    Give the same value in the DAG that commits and in the DAGs that wait (any server of
    the cluster works as long as every DAG names the same one first).

    :param pipeline: the :class:`~airflow_provider_eo.pipeline.Pipeline`, or its
        ``"module:ATTR"`` reference (imported, and a factory called, right now: keep such a
        module light, as the example's is).
    :param bootstrap: the cluster's bootstrap servers for the URI (only the first is used).
    :param stream_commits: add the watcher announcing stream-committed checkpoints (needs
        ``pipeline`` as its ``"module:ATTR"`` reference: the triggerer imports it).
    :param ledger_conn_id: the watcher's ledger connection, when not the pipeline's own.
    :param poll_interval: seconds between the watcher's reads of the ledger.
    """
    resolved = load_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    asset = kafka_asset(_servers(resolved, bootstrap, "sink"), resolved.sink_topic)
    if not stream_commits:
        return asset
    from airflow_provider_eo.triggers.stream import EoStreamCommitsTrigger

    settings, withheld = resolved.public_settings()
    trigger = EoStreamCommitsTrigger(
        pipeline=_reference(pipeline, "stream_commits=True"),
        ledger_conn_id=ledger_conn_id,
        poll_interval=poll_interval,
        settings=settings,
        withheld=withheld,
    )
    return _watched(asset, f"eo_stream_commits_{resolved.name}", trigger)


def source_asset(
    pipeline: str,
    *,
    bootstrap: str | None = None,
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    poll_interval: float = 5.0,
    refire_after: float = 600.0,
) -> Asset:
    """The asset of ``pipeline``'s (first) source topic, watched by
    :class:`~airflow_provider_eo.triggers.source.EoSourceRecordsTrigger` over all its source
    topics: schedule the pipeline's DAG on it (``schedule=[source_asset(...)]``) and a run
    starts when the sources hold stable records the ledger has not planned, one run per
    planned position (see :mod:`airflow_provider_eo.triggers.source` for the guarantees).

    Nothing is read now; the triggerer imports the pipeline and reads its connections. The
    watcher also records the pipeline's settings without their secrets
    (:meth:`~airflow_provider_eo.pipeline.Pipeline.public_settings`): Airflow's triggerer does
    not load DAG bundles, so where the pipeline's module lives only with the DAGs the watcher
    runs on them, its connections supplying the secrets; a pipeline whose secrets are in code
    needs its module importable by the triggerer (else the watcher's error event fails the
    run it starts, naming what to do). The URI's server follows :func:`sink_asset`'s rule.
    Name this asset the same way in every DAG file that names it (Airflow keeps its watchers
    as the DAG file parsed last has them).

    :param pipeline: the pipeline's ``"module:ATTR"`` reference (imported now for its
        topics, and by the triggerer).
    :param bootstrap: the cluster's bootstrap servers for the URI, when the pipeline names
        its cluster only through ``kafka_conn_id``.
    :param kafka_conn_id: the watcher's Kafka connection, when not the pipeline's own.
    :param ledger_conn_id: the watcher's ledger connection, when not the pipeline's own.
    :param poll_interval: seconds between the watcher's polls (Kafka offsets and the ledger).
    :param refire_after: seconds a firing may stay without a plan before the watcher fires
        again (a run that failed before its plan task).
    """
    from airflow_provider_eo.triggers.source import EoSourceRecordsTrigger

    resolved = load_pipeline(_reference(pipeline, "source_asset"))
    asset = kafka_asset(_servers(resolved, bootstrap, "source"), resolved.source_topics[0])
    settings, withheld = resolved.public_settings()
    trigger = EoSourceRecordsTrigger(
        pipeline=pipeline,
        kafka_conn_id=kafka_conn_id,
        ledger_conn_id=ledger_conn_id,
        poll_interval=poll_interval,
        refire_after=refire_after,
        settings=settings,
        withheld=withheld,
    )
    return _watched(asset, f"eo_source_{resolved.name}", trigger)


def _reference(pipeline: Pipeline | str, what: str) -> str:
    if not isinstance(pipeline, str) or ":" not in pipeline:
        name = pipeline.name if isinstance(pipeline, Pipeline) else pipeline
        raise PipelineConfigError(
            f"pipeline {name!r}: {what} needs the pipeline's 'module:ATTR' reference (the "
            "triggerer imports it), not a Pipeline object or a name"
        )
    return pipeline


def _watched(asset: Asset, name: str, trigger: Any) -> Asset:
    """``asset`` with one ``AssetWatcher`` running ``trigger``."""
    from airflow.sdk import AssetWatcher

    return Asset(name=asset.name, uri=asset.uri, watchers=[AssetWatcher(name=name, trigger=trigger)])


def _servers(resolved: Pipeline, bootstrap: str | None, which: str) -> str:
    servers = bootstrap or resolved.kafka.get("bootstrap.servers")
    if not servers:
        raise PipelineConfigError(
            f"pipeline {resolved.name!r}: its {which} asset needs a Kafka bootstrap server, and the "
            f"pipeline names its cluster only through the connection {resolved.kafka_conn_id!r}, "
            "which is not read while a DAG is parsed. Pass bootstrap='host:port' (a server of "
            "that cluster, the same in every DAG that names this asset), or give the pipeline "
            "kafka={'bootstrap.servers': ...} (the connection's settings still win at run time)."
        )
    return str(servers)


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


def event_checkpoint(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The checkpoint an asset event of a sink asset carries (:func:`checkpoint_extra`),
    whoever emitted it: a commit task's event has it as its ``extra``, the stream-commit
    watcher's (a trigger's event) under ``extra["payload"]``. Empty for any other event; the
    watcher's error event (it could not load the pipeline in the triggerer) raises
    :class:`~airflow_provider_eo.errors.WatcherSetupError` with its error."""
    from airflow_provider_eo.errors import WatcherSetupError
    from airflow_provider_eo.triggers.checkpoint import watcher_error

    error = watcher_error(extra)
    if error is not None:
        raise WatcherSetupError(error)
    extra = dict(extra or {})
    if extra.get("from_trigger") and isinstance(extra.get("payload"), Mapping):
        extra = dict(extra["payload"])
    return extra if "checkpoint_id" in extra else {}


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
    "event_checkpoint",
    "kafka_asset",
    "sink_asset",
    "source_asset",
    "topic_of",
    "topic_outlets",
]
