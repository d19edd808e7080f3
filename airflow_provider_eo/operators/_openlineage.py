"""OpenLineage for the eo operators: ``get_openlineage_facets_on_start`` /
``..._on_complete`` / ``..._on_failure``, which the OpenLineage provider's listener calls
around each task (docs/observability.md, "OpenLineage").

Inputs are the pipeline's source topics, the output its sink topic (a backfill's target
topic), named ``kafka://{host}:{port}`` / topic (:mod:`airflow_provider_eo.openlineage`);
the ``eo`` run facet says what the task knows at that moment: at start the pipeline and the
checkpoint id it was given, at completion (or failure) the checkpoint as the ledger showed
it last (ranges, records, state) or what a backfill or a stream finished. A pipeline that
names its cluster only through a ``kafka`` connection gets its namespace from that
connection, read as the task reads it (:meth:`PipelineTaskMixin.resolve_pipeline`); only
the server's host and port reach an event.

Lineage never fails a task: without the OpenLineage provider the methods return ``None``
at once, and any error building an event is logged and gives ``None`` (the provider then
emits its event without eo's datasets).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.operators.base import PipelineTaskMixin, parse_checkpoint_id

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_eo.ledger.records import CheckpointRecord
    from airflow_provider_eo.openlineage import EoLineage
    from airflow_provider_eo.pipeline import Pipeline

log = logging.getLogger(__name__)


class OpenLineageMixin(PipelineTaskMixin):
    """The OpenLineage methods of an eo operator. Listed before :class:`PipelineTaskMixin`
    in the operator's bases; ``execute`` tells it what it learnt with
    :meth:`remember_for_lineage`, and an operator that writes elsewhere than the pipeline's
    sink overrides :meth:`lineage_sink_topic`."""

    def resolve_pipeline(self) -> Pipeline:
        """:meth:`PipelineTaskMixin.resolve_pipeline`, kept for the completion event."""
        pipeline = super().resolve_pipeline()
        self._eo_lineage_pipeline = pipeline
        return pipeline

    def remember_for_lineage(self, *, checkpoint: CheckpointRecord | None = None, **facts: Any) -> None:
        """Record for the completion (or failure) event ``checkpoint`` (as the ledger shows it
        now) and ``facts`` (``eo`` facet fields, e.g. ``state="COMMITTED"``); later calls
        add to earlier ones."""
        if checkpoint is not None:
            self._eo_lineage_checkpoint = checkpoint
        known: dict[str, Any] = getattr(self, "_eo_lineage_facts", {})
        self._eo_lineage_facts = {**known, **facts}

    def lineage_sink_topic(self, pipeline: Pipeline) -> str | None:
        """The topic this task writes; ``None`` for the pipeline's sink."""
        return None

    def lineage(self, pipeline: Pipeline) -> EoLineage:
        """This task's lineage now: the pipeline's topics, the checkpoint id it was given,
        and what :meth:`remember_for_lineage` recorded."""
        from airflow_provider_eo.openlineage import task_lineage

        given: int | None = None
        if getattr(self, "checkpoint_id", None) is not None:
            try:
                given = parse_checkpoint_id(self.checkpoint_id, task_id=self.task_id)
            except Exception:  # unset (skipped) or not a number: the task itself says so
                given = None
        checkpoint: CheckpointRecord | None = getattr(self, "_eo_lineage_checkpoint", None)
        facts: dict[str, Any] = dict(getattr(self, "_eo_lineage_facts", {}))
        if checkpoint is None and given is not None:
            facts.setdefault("checkpointId", given)
        return task_lineage(
            pipeline, checkpoint=checkpoint, sink_topic=self.lineage_sink_topic(pipeline), **facts
        )

    def _operator_lineage(self, moment: str) -> OperatorLineage | None:
        from airflow_provider_eo.openlineage import openlineage_installed, to_operator_lineage

        if not openlineage_installed():
            return None
        try:
            pipeline: Pipeline | None = getattr(self, "_eo_lineage_pipeline", None)
            if pipeline is None:  # before execute (start), or execute failed before resolving
                pipeline = self.resolve_pipeline()
            return to_operator_lineage(self.lineage(pipeline))
        except Exception as exc:
            log.warning(
                "task %s (pipeline %s): no eo OpenLineage facets on %s: %s",
                self.task_id,
                self.pipeline,
                moment,
                exc,
            )
            return None

    def get_openlineage_facets_on_start(self) -> OperatorLineage | None:
        """The START event's datasets and ``eo`` facet (pipeline, given checkpoint id)."""
        return self._operator_lineage("start")

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage | None:
        """The COMPLETE event's datasets and ``eo`` facet (what the task did)."""
        return self._operator_lineage("complete")

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage | None:
        """The FAIL event's datasets and ``eo`` facet (as far as the task got)."""
        return self._operator_lineage("failure")
