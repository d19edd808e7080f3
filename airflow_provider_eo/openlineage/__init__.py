"""What an eo task tells OpenLineage: the Kafka topics it reads and writes, and an ``eo``
run facet with the pipeline and the checkpoint it worked on.

The OpenLineage provider (``apache-airflow-providers-openlineage``, the ``openlineage``
extra) calls each eo operator's ``get_openlineage_facets_on_start`` /
``..._on_complete`` / ``..._on_failure``
(:class:`~airflow_provider_eo.operators._openlineage.OpenLineageMixin`); they build an
:class:`EoLineage` here, which is plain data, and turn it into the provider's
``OperatorLineage`` with :func:`to_operator_lineage`, the one place that imports
OpenLineage (and only when a task runs, never while a DAG file is parsed).

Datasets are named as the OpenLineage naming spec names Kafka topics: namespace
``kafka://{host}:{port}`` of a bootstrap server, name the topic. The server is the first of
``bootstrap.servers`` written as :func:`~airflow_provider_eo.assets.asset_server` writes it,
so the sink topic's dataset is the one the Kafka provider converts the pipeline's sink
asset (``kafka://<server>/<topic>``) into. Nothing in an event is a secret: a bootstrap
server's host and port, topic names, the pipeline and checkpoint facts below.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.assets import asset_server

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_eo.ledger.records import CheckpointRecord
    from airflow_provider_eo.pipeline import Pipeline

#: The key of the eo run facet in an event's ``run.facets``.
FACET_NAME = "eo"
#: Source ranges listed in the facet; a checkpoint over more partitions lists the first
#: ones and counts the rest in ``rangesOmitted``.
MAX_FACET_RANGES = 256


def kafka_namespace(bootstrap: str) -> str:
    """The OpenLineage namespace of a Kafka cluster: ``kafka://{host}:{port}`` of the first
    bootstrap server (without a ``PROTOCOL://`` prefix, host in lower case, port 9092 when
    none is given).

    >>> kafka_namespace("SASL_SSL://Broker-1.example:9093,broker-2.example:9093")
    'kafka://broker-1.example:9093'
    """
    return f"kafka://{asset_server(bootstrap)}"


def pipeline_namespace(pipeline: Pipeline) -> str | None:
    """The namespace of ``pipeline``'s Kafka cluster, from its ``bootstrap.servers`` (a
    pipeline resolved by a task has its ``kafka`` connection's settings merged in); ``None``
    when it names no server."""
    servers = pipeline.kafka.get("bootstrap.servers")
    if not servers:
        return None
    try:
        return kafka_namespace(str(servers))
    except ValueError:  # not host:port: the task itself reports that, with its own message
        return None


def checkpoint_facts(cp: CheckpointRecord) -> dict[str, Any]:
    """The facet fields of a checkpoint as the ledger shows it: ``checkpointId``,
    ``state``, ``recordsPlanned`` (offsets planned), ``records`` (records staged, once
    prepared), ``ranges`` (``topic``, ``partition``, ``start``, ``end``; the first
    :data:`MAX_FACET_RANGES`) and the ``transactionalIdPrefix`` its commit plan pinned."""
    ranges = [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in cp.ranges]
    facts: dict[str, Any] = {
        "checkpointId": cp.checkpoint_id,
        "state": cp.state.value,
        "recordsPlanned": sum(r.end - r.start for r in cp.ranges),
        "records": cp.records,
        "ranges": ranges[:MAX_FACET_RANGES],
    }
    if len(ranges) > MAX_FACET_RANGES:
        facts["rangesOmitted"] = len(ranges) - MAX_FACET_RANGES
    if cp.commit_plan is not None:
        facts["transactionalIdPrefix"] = cp.commit_plan.transactional_id_prefix
    return facts


@dataclass(frozen=True)
class EoLineage:
    """What one eo task reads and writes, and its ``eo`` run facet, as plain data.

    :param namespace: the Kafka cluster's namespace (:func:`kafka_namespace`); ``None``
        when unknown, and then the event names no dataset.
    :param inputs: the topics read.
    :param outputs: the topics written.
    :param facet: the ``eo`` run facet's fields (:class:`~airflow_provider_eo.openlineage.facets.EoRunFacet`);
        ``None`` values are left out.
    """

    namespace: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    facet: Mapping[str, Any] = field(default_factory=dict)

    def datasets(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """``(inputs, outputs)`` as ``(namespace, name)`` pairs; empty without a namespace."""
        if self.namespace is None:
            return [], []
        return [(self.namespace, t) for t in self.inputs], [(self.namespace, t) for t in self.outputs]


def task_lineage(
    pipeline: Pipeline,
    *,
    checkpoint: CheckpointRecord | None = None,
    inputs: Iterable[str] | None = None,
    sink_topic: str | None = None,
    **facts: Any,
) -> EoLineage:
    """The lineage of a task of ``pipeline``: its source topics in, ``sink_topic`` (default
    the pipeline's sink) out; the facet holds the pipeline's name, sink topic and
    transactional-id prefix, then ``checkpoint``'s facts (:func:`checkpoint_facts`), then
    ``facts`` (facet fields the task knows: e.g. ``checkpointId`` before it read the
    ledger, or a backfill's ``checkpointIds``). ``None`` values are dropped.

    :param pipeline: the pipeline, as the task resolved it (its connections applied).
    :param checkpoint: the checkpoint the task worked on, as the ledger showed it last.
    :param inputs: the topics read, when not the pipeline's source topics.
    :param sink_topic: the topic written, when not the pipeline's sink (a backfill's).
    """
    sink = sink_topic or pipeline.sink_topic
    facet: dict[str, Any] = {
        "pipeline": pipeline.name,
        "sinkTopic": sink,
        "transactionalIdPrefix": pipeline.transactional_id_prefix,
    }
    if checkpoint is not None:
        facet.update(checkpoint_facts(checkpoint))
    facet.update(facts)
    return EoLineage(
        namespace=pipeline_namespace(pipeline),
        inputs=tuple(inputs if inputs is not None else pipeline.source_topics),
        outputs=(sink,),
        facet={k: v for k, v in facet.items() if v is not None},
    )


def openlineage_installed() -> bool:
    """Whether the OpenLineage provider is installed (nothing is imported to find out)."""
    try:
        return importlib.util.find_spec("airflow.providers.openlineage") is not None
    except (ImportError, ValueError):
        return False


def to_operator_lineage(lineage: EoLineage) -> OperatorLineage | None:
    """The OpenLineage provider's ``OperatorLineage`` for ``lineage`` (Kafka datasets and
    the ``eo`` run facet); ``None`` when the provider is not installed."""
    if not openlineage_installed():
        return None
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_eo.openlineage.facets import EoRunFacet

    inputs, outputs = lineage.datasets()
    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in inputs],
        outputs=[Dataset(namespace=ns, name=name) for ns, name in outputs],
        run_facets={FACET_NAME: EoRunFacet.from_fields(lineage.facet)},
    )


__all__ = [
    "FACET_NAME",
    "MAX_FACET_RANGES",
    "EoLineage",
    "checkpoint_facts",
    "kafka_namespace",
    "openlineage_installed",
    "pipeline_namespace",
    "task_lineage",
    "to_operator_lineage",
]
