"""Savepoints and stop/resume (docs/design.md §7).

A savepoint names the end offsets of a COMMITTED checkpoint: the newest one at or below the
highest checkpoint in flight when it was asked for (so it waits for that one to finish, and
never for a checkpoint planned after the request). After a restore or reset, until the new
lineage commits its first checkpoint, it names the offsets that restore or reset started
from instead, with no checkpoint id (messages say "before the first checkpoint"). Taking one
never changes output.

Stop-with-savepoint, in this order:

1. mark the pipeline stopped (plan refuses new checkpoints from now on, under the pipeline
   row's lock, so no plan can slip in after the stop);
2. wait until every checkpoint that was in flight is COMMITTED or ABORTED;
3. record the savepoint at the newest COMMITTED checkpoint at or below them (or at the
   lineage's start, as above).

A timeout leaves the stop in place (and says so): the pipeline stays quiet while the
operator looks at the stuck checkpoint.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Callable

from airflow_provider_eo.errors import SavepointTimeout
from airflow_provider_eo.ledger import Actor, CheckpointRecord, InvariantViolation, Ledger, PipelineRecord
from airflow_provider_eo.ledger.records import SavepointRecord
from airflow_provider_eo.ledger.savepoints import NothingCommitted
from airflow_provider_eo.pipeline import Pipeline

#: Called while waiting: (the unfinished checkpoint waited for, seconds waited, wait_s).
Progress = Callable[[CheckpointRecord, float, float], None]


def who(actor: Actor | None = None) -> str:
    """Who asks: the Airflow actor's ``dag/run/task#try@host:pid`` when given, else the
    CLI user as ``user@host``."""
    if actor is not None and (actor.dag_id or actor.run_id):
        return actor.label()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): still say where
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def stop_pipeline(
    pipeline: Pipeline, ledger: Ledger, *, reason: str, actor: Actor | None = None
) -> PipelineRecord:
    """Mark ``pipeline`` stopped: plan refuses new checkpoints (:class:`PipelineStopped`),
    the unfinished one still prepares and commits. Idempotent (a second stop keeps the
    first one's who/when/why). An unknown pipeline is refused and nothing is recorded."""
    return ledger.stop_pipeline(pipeline.name, stopped_by=who(actor), reason=reason, actor=actor)


def resume_pipeline(pipeline: Pipeline, ledger: Ledger, *, actor: Actor | None = None) -> PipelineRecord:
    """Clear the stop: plan starts new checkpoints again. Idempotent."""
    return ledger.resume_pipeline(pipeline.name, resumed_by=who(actor), actor=actor)


def begin_savepoint(
    pipeline: Pipeline, ledger: Ledger, name: str, *, stop: bool = False, actor: Actor | None = None
) -> int:
    """Steps 1 of a savepoint (see the module docstring): refuse what cannot be recorded,
    mark the pipeline stopped when ``stop``, and return the highest checkpoint id handed out
    so far: the savepoint waits for the unfinished checkpoints up to it
    (:func:`savepoint_waits_for`) and names the newest COMMITTED one at or below it
    (:func:`record_savepoint`).

    Refused before anything is recorded (and before a stop): an empty name, an unknown
    pipeline, a used name, a pipeline with nothing committed and nothing in flight.
    """
    if not name:
        raise ValueError(f"pipeline {pipeline.name!r}: a savepoint name must be non-empty")
    names = {sp.name for sp in ledger.list_savepoints(pipeline.name)}  # unknown pipeline: refused
    if name in names:
        existing = ledger.get_savepoint(pipeline.name, name)
        raise InvariantViolation(
            f"pipeline {pipeline.name!r}: savepoint {name!r} already exists (created "
            f"{existing.created_at.isoformat()} by {existing.created_by or 'unknown'}, "
            f"{existing.position}); nothing was changed. Pick another name, or delete it "
            f"first with `eo savepoint delete MODULE:ATTR {name}`."
        )
    if ledger.unfinished(pipeline.name) is None and ledger.last_committed(pipeline.name) is None:
        raise NothingCommitted(
            f"pipeline {pipeline.name!r} has no COMMITTED checkpoint yet, so savepoint {name!r} "
            "has no position to name; nothing was recorded. Run the pipeline until a checkpoint "
            "commits (`eo run-once MODULE:ATTR`), then take the savepoint again."
        )
    if stop:
        stop_pipeline(pipeline, ledger, reason=f"stop with savepoint {name!r}", actor=actor)
    # The highest checkpoint id handed out so far: the in-flight one, if any. Read after the
    # stop, so with stop=True nothing can be planned above it any more.
    return ledger.get_pipeline(pipeline.name).last_checkpoint_id


def savepoint_waits_for(pipeline: Pipeline, ledger: Ledger, target: int) -> CheckpointRecord | None:
    """Step 2: the lowest unfinished checkpoint at or below ``target`` (the savepoint waits
    until it is COMMITTED or ABORTED), or None when nothing is left to wait for."""
    low = ledger.unfinished(pipeline.name)
    return low if low is not None and low.checkpoint_id <= target else None


def savepoint_timeout(
    pipeline: Pipeline, name: str, low: CheckpointRecord, wait_s: float, *, stop: bool
) -> SavepointTimeout:
    """The refusal when ``low`` is still unfinished after ``wait_s``."""
    left = " The pipeline stays STOPPED (`eo resume MODULE:ATTR` to undo)." if stop else ""
    return SavepointTimeout(
        f"pipeline {pipeline.name!r}: savepoint {name!r} not taken: checkpoint "
        f"{low.checkpoint_id} is still {low.state.value} after {wait_s:.0f}s.{left} "
        f"Commit it (`eo commit MODULE:ATTR --checkpoint {low.checkpoint_id}`) or abort it, then ask "
        "again, or give a longer --wait."
    )


def record_savepoint(
    pipeline: Pipeline,
    ledger: Ledger,
    name: str,
    target: int,
    *,
    note: str = "",
    actor: Actor | None = None,
    created_by: str = "",
) -> SavepointRecord:
    """Step 3: record savepoint ``name`` at the newest COMMITTED checkpoint at or below
    ``target`` (or at the lineage's start)."""
    return ledger.savepoint_at_checkpoint(
        pipeline.name, name, at_or_below=target, note=note, created_by=created_by or who(actor), actor=actor
    )


def take_savepoint(
    pipeline: Pipeline,
    ledger: Ledger,
    name: str,
    *,
    note: str = "",
    stop: bool = False,
    wait_s: float = 600.0,
    actor: Actor | None = None,
    created_by: str = "",
    poll_s: float = 1.0,
    progress: Progress | None = None,
) -> SavepointRecord:
    """Record savepoint ``name`` of ``pipeline`` (see the module docstring for the order).

    Points at the newest COMMITTED checkpoint at or below the highest checkpoint in flight
    when called; waits up to ``wait_s`` for those in flight to finish, calling ``progress``
    every ``poll_s``. ``stop=True`` marks the pipeline stopped FIRST. Raises
    :class:`SavepointTimeout` after ``wait_s`` (no savepoint; a stop stays in place).

    Refused before anything is recorded (and before a stop): see :func:`begin_savepoint`.
    """
    target = begin_savepoint(pipeline, ledger, name, stop=stop, actor=actor)
    started = time.monotonic()
    while (low := savepoint_waits_for(pipeline, ledger, target)) is not None:
        waited = time.monotonic() - started
        if waited >= wait_s:
            raise savepoint_timeout(pipeline, name, low, wait_s, stop=stop)
        if progress is not None:
            progress(low, waited, wait_s)
        time.sleep(min(poll_s, max(0.0, wait_s - waited)))
    return record_savepoint(pipeline, ledger, name, target, note=note, actor=actor, created_by=created_by)
