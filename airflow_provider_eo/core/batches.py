"""Checkpoints planned by a Structured Streaming query: the two-phase-commit sink of its
micro-batches (docs/design.md §12).

Spark's micro-batch engine writes batch N's source offsets to the query's offset log before
it runs the batch, re-runs N with the same offsets (and the state of N-1) after a failure,
and calls ``foreachBatch(df, N)`` again with the same id; its commit log records N only
after ``foreachBatch`` returned. That is Flink's checkpoint; this module is the other half,
keyed by ``(query id, batch id)``:

- N already COMMITTED (or below the newest batch the ledger knows) with the ranges the
  ledger recorded for it: nothing to do. Other ranges (a checkpoint location that is not
  the one that wrote the ledger's batches) are refused, never skipped: Spark would record
  the batch done while records it covers were never published.
- N PREPARED: commit the staged output already recorded, never the re-run's ``df`` (a
  nondeterministic query may differ on re-run, and part of the first run may be published).
- N PLANNED (a run died before it staged): stage ``df`` for it.
- else: record N PLANNED with the batch's ranges (contiguous with the previous batch's, the
  ledger checks), then stage and commit.

The ledger's newest checkpoint decides; checkpoints commit strictly in order
(``max_pending`` is 1), so nothing is published out of order. A different query id under
the same name (a new checkpoint location writing the same sink) is refused unless the sink
is told to accept it, like a fresh ledger is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from airflow_provider_eo.core.commit_plan import pinned_prefix, record_planned, sink_partitions
from airflow_provider_eo.core.coordinator import Planned, Step
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.core.plan import check_may_plan
from airflow_provider_eo.errors import BatchOutOfStep as BatchOutOfStep
from airflow_provider_eo.errors import BatchRangesDiffer as BatchRangesDiffer
from airflow_provider_eo.errors import QueryIdentityMismatch as QueryIdentityMismatch
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointNotFound,
    CheckpointRecord,
    CheckpointState,
    Ledger,
    RangeSpec,
)
from airflow_provider_eo.pipeline import Pipeline

__all__ = [
    "BatchOutOfStep",
    "BatchPosition",
    "BatchRangesDiffer",
    "BatchStep",
    "OffsetLog",
    "QueryIdentityMismatch",
    "begin_batch",
    "decide",
    "live_checkpoints",
    "newest_checkpoint",
]

log = logging.getLogger(__name__)

Action = Literal["skip", "stage", "commit", "commit_previous", "plan"]


@dataclass(frozen=True)
class BatchPosition:
    """One micro-batch as the query's checkpoint location records it.

    :param query_id: the query's id (its checkpoint location's ``metadata``).
    :param batch_id: the micro-batch id ``foreachBatch`` got.
    :param ranges: ``[start, end)`` of every Kafka partition the batch covers (empty ones too).
    """

    query_id: str
    batch_id: int
    ranges: tuple[RangeSpec, ...]


@dataclass(frozen=True)
class BatchStep:
    """What the sink does for a batch: ``skip`` (already published), ``stage`` the batch's
    frame for ``checkpoint`` (PLANNED) then commit it, or ``commit`` the output ``checkpoint``
    already staged (PREPARED)."""

    action: Literal["skip", "stage", "commit"]
    checkpoint: CheckpointRecord | None
    reason: str


def live_checkpoints(ledger: Ledger, pipeline: str) -> list[CheckpointRecord]:
    """The pipeline's checkpoints that were not aborted."""
    try:
        checkpoints = ledger.list_checkpoints(pipeline)
    except CheckpointNotFound:
        return []
    return [c for c in checkpoints if c.state is not CheckpointState.ABORTED]


def newest_checkpoint(ledger: Ledger, pipeline: str) -> CheckpointRecord | None:
    """The pipeline's newest checkpoint that was not aborted, or None."""
    live = live_checkpoints(ledger, pipeline)
    return max(live, key=lambda c: c.checkpoint_id) if live else None


def _where(pipeline: str, pos: BatchPosition) -> str:
    return f"pipeline {pipeline!r}, query {pos.query_id}, batch {pos.batch_id}"


def decide(
    pipeline: str,
    newest: CheckpointRecord | None,
    pos: BatchPosition,
    *,
    allow_new_query: bool,
    recorded: CheckpointRecord | None = None,
) -> tuple[Action, str]:
    """What batch ``pos`` calls for, given the ledger's newest live checkpoint and the live
    checkpoint ``recorded`` for this query's batch id, if any (pure).

    A batch at or below the newest is skipped only as a replay: with the ranges the ledger
    recorded for it, or (no checkpoint holds it, e.g. it was aborted) with ranges that end
    within the newest checkpoint's. Anything else is :class:`BatchRangesDiffer`.

    ``commit_previous``: the newest checkpoint is an earlier batch still PREPARED (the query
    recorded that batch done without the sink finishing it: a checkpoint location restored
    or copied); its staged output is committed first, then this batch is decided again.
    """
    where = _where(pipeline, pos)
    if newest is None:
        return "plan", "the pipeline's first batch"
    if newest.query_id is None:
        raise QueryIdentityMismatch(
            f"{where}: pipeline {pipeline!r} is planned by eo itself (checkpoint "
            f"{newest.checkpoint_id}), not by a Structured Streaming query; give the sink its own name"
        )
    if newest.query_id != pos.query_id:
        if not allow_new_query:
            raise QueryIdentityMismatch(
                f"{where}: this sink was written by query {newest.query_id} (batch {newest.batch_id}, "
                f"checkpoint {newest.checkpoint_id}); a query with another checkpoint location now "
                "writes it under the same name. Nothing was published. Use the old checkpoint "
                "location, another sink name, or KafkaExactlyOnceSink(allow_new_query=True) to "
                "continue this pipeline with the new query (its ranges must continue where the old "
                "one's ended)."
            )
        if newest.state is not CheckpointState.COMMITTED:
            raise BatchOutOfStep(
                f"{where}: checkpoint {newest.checkpoint_id} of the previous query {newest.query_id} "
                f"is {newest.state.value}; finish it with the old query or abort it "
                f"(`eo abort {pipeline} {newest.checkpoint_id}`) before the new query takes over"
            )
        # The new query continues the pipeline's lineage only from the old one's ends (a
        # query started from its source's earliest offsets would publish them again).
        ends = {r.key: r.end for r in newest.ranges}
        apart = tuple(r for r in _sorted(pos.ranges) if r.key in ends and r.start != ends[r.key])
        if apart:
            raise QueryIdentityMismatch(
                f"{where}: allow_new_query continues pipeline {pipeline!r} where query "
                f"{newest.query_id} ended (checkpoint {newest.checkpoint_id}, batch {newest.batch_id}: "
                f"{_ranges(newest.ranges)}), but this query's batch starts elsewhere: "
                f"{_ranges(apart)}. Nothing was published. Start the new query with the Kafka "
                f"source option startingOffsets={_starting_offsets(newest.ranges)} (its first "
                "batch then starts at those ends), or restart the old query from its checkpoint location."
            )
        return "plan", f"a new query after checkpoint {newest.checkpoint_id} of query {newest.query_id}"
    assert newest.batch_id is not None
    if pos.batch_id == newest.batch_id:
        recorded = newest
    # 1. A batch the ledger holds is a replay only with the ranges it was recorded with.
    if recorded is not None and _sorted(recorded.ranges) != _sorted(pos.ranges):
        raise BatchRangesDiffer(
            f"{where}: checkpoint {recorded.checkpoint_id} ({recorded.state.value}) recorded this "
            f"batch with ranges {_ranges(recorded.ranges)}, the query's offset log says "
            f"{_ranges(pos.ranges)}: this checkpoint location is not the one that wrote the "
            f"ledger's batches (restored from an older copy, or replaced). {_NOT_SKIPPED}"
        )
    if pos.batch_id < newest.batch_id:
        # 2. Below the newest with no checkpoint of its own (aborted): skipped only when every
        #    range ends within what the newest checkpoint covers.
        beyond = _past(newest.ranges, pos.ranges) if recorded is None else ()
        if beyond:
            raise BatchRangesDiffer(
                f"{where}: no checkpoint holds this batch, and its ranges reach past the newest "
                f"checkpoint {newest.checkpoint_id} (batch {newest.batch_id}, ranges "
                f"{_ranges(newest.ranges)}): {_ranges(beyond)}. {_NOT_SKIPPED}"
            )
        return "skip", (
            f"batch {pos.batch_id} is below batch {newest.batch_id} (checkpoint {newest.checkpoint_id}, "
            f"{newest.state.value}): its output was published before"
        )
    if pos.batch_id == newest.batch_id:
        if newest.state is CheckpointState.COMMITTED:
            return "skip", f"checkpoint {newest.checkpoint_id} already COMMITTED"
        if newest.state is CheckpointState.PREPARED:
            return "commit", f"checkpoint {newest.checkpoint_id} PREPARED by an earlier run of the batch"
        return "stage", f"checkpoint {newest.checkpoint_id} PLANNED by an earlier run of the batch"
    if newest.state is CheckpointState.COMMITTED:
        return "plan", f"the batch after checkpoint {newest.checkpoint_id}"
    if newest.state is CheckpointState.PREPARED:
        return "commit_previous", (
            f"checkpoint {newest.checkpoint_id} (batch {newest.batch_id}) is PREPARED but the query "
            f"is at batch {pos.batch_id}: committing its staged output first"
        )
    raise BatchOutOfStep(
        f"{where}: checkpoint {newest.checkpoint_id} (batch {newest.batch_id}) is PLANNED and was never "
        f"staged, but the query has moved on to batch {pos.batch_id} (its checkpoint location is "
        f"newer than the ledger). Abort it (`eo abort {pipeline} {newest.checkpoint_id}`) and restart "
        "the query; its ranges are then planned with this batch."
    )


_NOT_SKIPPED = (
    "Nothing was staged or published, and the batch is not skipped (Spark would record it "
    "done unpublished). Restart the query from the checkpoint location that wrote the "
    "ledger's batches, or write this query under another pipeline name."
)


def _sorted(ranges: tuple[RangeSpec, ...]) -> tuple[RangeSpec, ...]:
    return tuple(sorted(ranges, key=lambda r: r.key))


def _starting_offsets(ranges: tuple[RangeSpec, ...]) -> str:
    """The Kafka source's ``startingOffsets`` JSON that starts at ``ranges``' ends."""
    out: dict[str, dict[str, int]] = {}
    for r in _sorted(ranges):
        out.setdefault(r.topic, {})[str(r.partition)] = r.end
    return json.dumps(out, separators=(",", ":"))


def _past(covered: tuple[RangeSpec, ...], ranges: tuple[RangeSpec, ...]) -> tuple[RangeSpec, ...]:
    """The ``ranges`` that end past the ``covered`` ones' ends (or on a partition they lack)."""
    ends = {r.key: r.end for r in covered}
    return tuple(r for r in _sorted(ranges) if r.key not in ends or r.end > ends[r.key])


def _ranges(ranges: tuple[RangeSpec, ...]) -> str:
    return ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in _sorted(ranges))


def begin_batch(
    pipeline: Pipeline,
    ledger: Ledger,
    pos: BatchPosition,
    *,
    allow_new_query: bool = False,
    actor: Actor | None = None,
    commit_previous: Callable[[int], object] | None = None,
    clients: KafkaClients | None = None,
) -> BatchStep:
    """Decide batch ``pos`` against the ledger and record it PLANNED when it is new.

    ``commit_previous(checkpoint_id)``: called to publish an earlier PREPARED batch before
    this one is planned (see :func:`decide`); without it that case is an error.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    prefix = pinned_prefix(pipeline, ledger, where="the Structured Streaming sink")
    for _ in range(2):
        live = live_checkpoints(ledger, pipeline.name)
        newest = max(live, key=lambda c: c.checkpoint_id) if live else None
        recorded = max(
            (c for c in live if c.query_id == pos.query_id and c.batch_id == pos.batch_id),
            key=lambda c: c.checkpoint_id,
            default=None,
        )
        action, reason = decide(
            pipeline.name, newest, pos, allow_new_query=allow_new_query, recorded=recorded
        )
        if action == "commit_previous":
            assert newest is not None
            if commit_previous is None:
                raise BatchOutOfStep(f"{_where(pipeline.name, pos)}: {reason}, but no committer was given")
            log.warning("%s: %s", _where(pipeline.name, pos), reason)
            commit_previous(newest.checkpoint_id)
            continue
        if action != "plan":
            return BatchStep(action, newest, reason)
        # A stopped pipeline, another ledger's markers, a ledger older than the sink: refused
        # before the batch is recorded, as every plan refuses them.
        check_may_plan(pipeline, ledger, clients=clients)
        cp = record_planned(
            pipeline,
            ledger,
            pos.ranges,
            prefix=prefix,
            partitions=sink_partitions(pipeline, clients=clients),
            max_pending=1,
            actor=actor,
            details={"reason": reason},
            batch=(pos.query_id, pos.batch_id),
        )
        return BatchStep("stage", cp, reason)
    raise BatchOutOfStep(
        f"{_where(pipeline.name, pos)}: the ledger kept changing while the batch was decided; retry the batch"
    )


@dataclass(frozen=True)
class OffsetLog:
    """The coordinator's range source of a Structured Streaming micro-batch: the ranges the
    query's offset log recorded for it (:func:`begin_batch` decides skip, stage or commit).

    :param position: the batch as the query's checkpoint location records it.
    :param allow_new_query: continue the pipeline with a query of another checkpoint location.
    :param commit_previous: publishes an earlier PREPARED batch first (see :func:`decide`).
    """

    position: BatchPosition
    allow_new_query: bool = False
    commit_previous: Callable[[int], object] | None = None

    def plan(
        self, pipeline: Pipeline, ledger: Ledger, actor: Actor, clients: KafkaClients | None = None
    ) -> Planned:
        """:func:`begin_batch`'s step as the coordinator's (``stage`` is ``prepare``)."""
        clients = kafka_clients(pipeline.kafka, clients)
        step = begin_batch(
            pipeline,
            ledger,
            self.position,
            allow_new_query=self.allow_new_query,
            actor=actor,
            commit_previous=self.commit_previous,
            clients=clients,
        )
        return Planned(step.checkpoint, _STEPS[step.action], step.reason)


#: A batch's action as the coordinator's step.
_STEPS: dict[str, Step] = {"skip": "skip", "stage": "prepare", "commit": "commit"}
