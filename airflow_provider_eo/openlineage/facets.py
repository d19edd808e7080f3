"""The ``eo`` OpenLineage run facet. Imports OpenLineage: load it only where an event is
built (:func:`airflow_provider_eo.openlineage.to_operator_lineage`), never at DAG parse."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import define, fields
from openlineage.client.facet_v2 import RunFacet

from airflow_provider_eo import __version__

#: The facet's ``_producer``: this package at its version (the OpenLineage provider's own
#: facets name that provider the same way).
PRODUCER = f"https://pypi.org/project/airflow-provider-eo/{__version__}"


@define
class EoRunFacet(RunFacet):
    """What an eo task did in this run: the pipeline and the checkpoint(s) it worked on.

    Each field is set once the task knows it: a plan's START has no checkpoint yet, its
    COMPLETE has the planned one; ``records`` appears once the checkpoint is prepared.
    ``_schemaURL`` is OpenLineage's generic run facet (as for the OpenLineage provider's
    ``airflow`` facet).

    :param pipeline: the pipeline's name.
    :param sinkTopic: the topic the task writes (a backfill's target topic).
    :param transactionalIdPrefix: the prefix of the sink's transactional ids
        (``{prefix}.{pipeline}.{shard}``), the one the checkpoint's commit plan pinned
        when known.
    :param checkpointId: the checkpoint the task worked on.
    :param state: that checkpoint's state in the ledger after the task (PLANNED,
        PREPARED, COMMITTED, ...).
    :param recordsPlanned: offsets planned (an upper bound of the records read).
    :param records: records prepared and, once COMMITTED, published.
    :param ranges: source offsets ``[start, end)`` per topic-partition (``topic``,
        ``partition``, ``start``, ``end``).
    :param rangesOmitted: ranges left out of ``ranges`` (a checkpoint over many partitions).
    :param backfillPipeline: a backfill's own pipeline name.
    :param checkpointIds: a backfill's checkpoints committed by this task.
    :param start: a backfill's interval start (ISO-8601).
    :param end: a backfill's interval end, exclusive (ISO-8601).
    :param commit: a stream's commit mode (``inline`` or ``airflow``).
    :param checkpoints: checkpoints a stream or backfill finished in this run.
    """

    pipeline: str
    sinkTopic: str  # OpenLineage facets spell fields in camelCase
    transactionalIdPrefix: str | None = None
    checkpointId: int | None = None
    state: str | None = None
    recordsPlanned: int | None = None
    records: int | None = None
    ranges: list[dict[str, Any]] | None = None
    rangesOmitted: int | None = None
    backfillPipeline: str | None = None
    checkpointIds: list[int] | None = None
    start: str | None = None
    end: str | None = None
    commit: str | None = None
    checkpoints: int | None = None

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> EoRunFacet:
        """The facet of :attr:`~airflow_provider_eo.openlineage.EoLineage.facet`'s fields
        (fields this version does not know are left out)."""
        known = {a.name for a in fields(cls) if a.init and not a.name.startswith("_")}
        return cls(**{k: v for k, v in values.items() if k in known}, producer=PRODUCER)
