"""Savepoints of a Structured Streaming query (docs/design.md §12): a position, the last
batch COMMITTED in the ledger (query id, batch id, its end offsets), and optionally a copy of
the query's checkpoint location as of that batch.

Restoring is starting the query from the copy (see :mod:`.checkpoint_location` for what it
holds). The copy keeps the query's id, so the sink takes the restarted query as the same
one: Spark re-runs the batches after the copy's batch N, and the ledger decides each
(:func:`airflow_provider_eo.core.batches.decide`):

- a batch up to the newest one the ledger holds is not published again (its output was);
- the first batch after it is published only when its ranges start where the ledger's newest
  batch ended (the ledger's contiguity check); otherwise the query stops with nothing
  published.

So a copy at the ledger's newest batch (stop the query first: ``eo stream-stop``) restores
exactly; an older copy restores only when the re-run batches end where the published ones
did, and never publishes a batch twice. Output is never rewound: to process records again,
write to another sink name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from airflow_provider_eo import staging_fs
from airflow_provider_eo.core.savepoint import take_savepoint, who
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, InvariantViolation, Ledger
from airflow_provider_eo.ledger.records import SavepointRecord
from airflow_provider_eo.ledger.savepoints import NothingCommitted
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.streaming.checkpoint_location import (
    CheckpointCopy,
    CheckpointLocationError,
    copy_at_batch,
    read_location,
    remove_copy,
)
from airflow_provider_eo.streaming.sink import KafkaExactlyOnceSink

__all__ = ["QuerySavepoint", "load_sink", "take_query_savepoint"]


@dataclass(frozen=True)
class QuerySavepoint:
    """A savepoint of a query's sink: the ledger's savepoint, the batch it names, the copy."""

    savepoint: SavepointRecord
    query_id: str
    batch_id: int
    copy: CheckpointCopy | None

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (``eo savepoint create --json``)."""
        out = {**self.savepoint.summary(), "query_id": self.query_id, "batch_id": self.batch_id}
        out["checkpoint_copy"] = None if self.copy is None else self.copy.destination
        return out


def load_sink(ref: str) -> KafkaExactlyOnceSink | None:
    """The :class:`KafkaExactlyOnceSink` at ``MODULE:ATTR``, None when it names anything else."""
    module_name, _, attr = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except ImportError:
        return None  # the pipeline loader says why
    return obj if isinstance(obj, KafkaExactlyOnceSink) else None


def _batches(ledger: Ledger, pipeline: str) -> list[CheckpointRecord]:
    return [c for c in ledger.list_checkpoints(pipeline) if c.query_id is not None]


def take_query_savepoint(
    pipeline: Pipeline,
    ledger: Ledger,
    name: str,
    *,
    checkpoint_location: str | None = None,
    copy_to: str | None = None,
    note: str = "",
    wait_s: float = 600.0,
    actor: Actor | None = None,
) -> QuerySavepoint:
    """Record savepoint ``name`` of the query writing ``pipeline``'s sink.

    Without ``copy_to``: at the newest COMMITTED batch (waiting for the batch in flight, as
    :func:`~airflow_provider_eo.core.savepoint.take_savepoint`). With it: at the newest batch
    COMMITTED both in the ledger and in ``checkpoint_location``'s commit log, after copying
    the location as of that batch to ``copy_to`` (the copy is removed when the savepoint
    cannot be recorded). Refused, with nothing recorded or copied: a pipeline whose
    checkpoints are not a query's batches, a location of another query, a used name.
    """
    batches = _batches(ledger, pipeline.name)
    if not batches:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: its checkpoints are not a Structured Streaming query's "
            "batches; take its savepoint with `eo savepoint create` on the pipeline"
        )
    if copy_to is None:
        sp = take_savepoint(pipeline, ledger, name, note=note, wait_s=wait_s, actor=actor)
        assert sp.checkpoint_id is not None
        cp = ledger.get(pipeline.name, sp.checkpoint_id)
        assert cp.query_id is not None and cp.batch_id is not None
        return QuerySavepoint(sp, cp.query_id, cp.batch_id, None)
    if not checkpoint_location:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: copying the query's checkpoint location needs it: give "
            "KafkaExactlyOnceSink(checkpoint_location=...) or --checkpoint-location"
        )
    if name in {sp.name for sp in ledger.list_savepoints(pipeline.name)}:
        raise InvariantViolation(
            f"pipeline {pipeline.name!r}: savepoint {name!r} already exists; nothing was copied. Pick "
            f"another name, or delete it first with `eo savepoint delete MODULE:ATTR {name}`."
        )
    query = str(max(batches, key=lambda c: c.checkpoint_id).query_id)
    store = staging_fs.store_for(pipeline)
    found = read_location(checkpoint_location, store)
    if found.query_id != query:
        raise CheckpointLocationError(
            f"pipeline {pipeline.name!r}: checkpoint location {checkpoint_location!r} belongs to query "
            f"{found.query_id}, the ledger's batches to query {query}; nothing was copied. Give the "
            "location the query writing this sink runs from."
        )
    spark_done = -1 if found.latest_commit is None else found.latest_commit
    candidates = [
        c
        for c in batches
        if c.query_id == query
        and c.state is CheckpointState.COMMITTED
        and c.batch_id is not None
        and c.batch_id <= spark_done
    ]
    if not candidates:
        raise NothingCommitted(
            f"pipeline {pipeline.name!r}: no batch of query {query} is COMMITTED both in the ledger "
            f"and in {checkpoint_location!r}'s commit log yet; nothing was copied. Let a batch finish, "
            "then ask again."
        )
    at = max(candidates, key=lambda c: c.checkpoint_id)
    assert at.batch_id is not None
    copy = copy_at_batch(checkpoint_location, copy_to, at.batch_id, store)
    said = f"query checkpoint copy at batch {at.batch_id}: {copy_to}"
    try:
        sp = ledger.savepoint_at_checkpoint(
            pipeline.name,
            name,
            at_or_below=at.checkpoint_id,
            note=f"{note} ({said})" if note else said,
            created_by=who(actor),
            actor=actor,
        )
    except BaseException:
        remove_copy(copy_to, store)
        raise
    if sp.checkpoint_id != at.checkpoint_id:  # a restore started a lineage after the batch
        ledger.delete_savepoint(pipeline.name, name, actor=actor)
        remove_copy(copy_to, store)
        raise InvariantViolation(
            f"pipeline {pipeline.name!r}: batch {at.batch_id} (checkpoint {at.checkpoint_id}) is not in "
            "the pipeline's current lineage; nothing was kept"
        )
    return QuerySavepoint(sp, query, at.batch_id, copy)
