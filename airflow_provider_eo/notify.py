"""Calling a pipeline's Airflow notifiers (``Pipeline(notifiers=...)``,
docs/observability.md, "Notifications").

The Airflow task that sees an event calls each notifier the pipeline names for it with the
task's context plus ``context["eo"]``::

    {"event": "dead_letters", "pipeline": "orders", "checkpoint_id": 7,
     "reason": "...", "dag_id": ..., "run_id": ..., "task_id": ..., **counts}

Events: ``checkpoint_aborted`` (an abort task aborted a checkpoint), ``data_loss`` (a task
refused to go on because data could be lost or duplicated: planned offsets deleted by
retention, a ledger older than the sink, another ledger's output in the sink, staged output
the committing process cannot see), ``dead_letters`` (a committed checkpoint sent more
records to the dead-letter topic than ``notify_dead_letters_above``), ``stream_stalled``
(a streaming driver's heartbeat went stale: it was lost).

A notifier that raises is logged; the task's outcome is what it would have been without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_eo.errors import (
    DataLossError,
    ForeignOutputInSink,
    LedgerBehindSink,
    StagingNotVisible,
)
from airflow_provider_eo.ledger import CheckpointRecord
from airflow_provider_eo.pipeline import NOTIFY_EVENTS, Pipeline

log = logging.getLogger(__name__)

#: The refusals that notify ``data_loss``: each stops a pipeline because going on could
#: lose or duplicate data.
DATA_LOSS_REFUSALS: tuple[type[Exception], ...] = (
    DataLossError,
    LedgerBehindSink,
    ForeignOutputInSink,
    StagingNotVisible,
)


def _identity(context: Mapping[str, Any]) -> dict[str, Any]:
    ti = context.get("ti")
    if ti is None:
        return {}
    return {k: getattr(ti, k, None) for k in ("dag_id", "run_id", "task_id")}


def notify(
    pipeline: Pipeline,
    event: str,
    context: Mapping[str, Any],
    *,
    checkpoint_id: int | None = None,
    reason: str = "",
    **counts: Any,
) -> int:
    """Call every notifier ``pipeline`` names for ``event``; returns how many ran without
    raising. Each gets a copy of ``context`` with ``context["eo"]`` added."""
    if event not in NOTIFY_EVENTS:
        raise ValueError(f"unknown notification event {event!r}; use {', '.join(NOTIFY_EVENTS)}")
    notifiers = list(pipeline.notifiers.get(event, ()))
    if not notifiers:
        return 0
    eo = {
        "event": event,
        "pipeline": pipeline.name,
        "checkpoint_id": checkpoint_id,
        "reason": reason,
        **_identity(context),
        **counts,
    }
    sent = 0
    for notifier in notifiers:
        try:
            notifier({**context, "eo": dict(eo)})
        except Exception:  # a notification never changes the task's outcome
            log.exception(
                "pipeline %s: notifier %s for %s (checkpoint %s) failed; the task goes on",
                pipeline.name,
                type(notifier).__name__,
                event,
                checkpoint_id,
            )
            continue
        sent += 1
    log.info("pipeline %s: %s notified (%d of %d notifier(s))", pipeline.name, event, sent, len(notifiers))
    return sent


def notify_refusal(
    pipeline: Pipeline, context: Mapping[str, Any], exc: BaseException, *, checkpoint_id: int | None = None
) -> bool:
    """``data_loss`` when ``exc`` is one of the :data:`DATA_LOSS_REFUSALS` (reason: its
    message, ``error``: its class); whether it was one (any other error notifies nothing)."""
    if not isinstance(exc, DATA_LOSS_REFUSALS):
        return False
    notify(
        pipeline,
        "data_loss",
        context,
        checkpoint_id=getattr(exc, "checkpoint_id", None) or checkpoint_id,
        reason=str(exc),
        error=type(exc).__name__,
    )
    return True


def notify_committed(pipeline: Pipeline, context: Mapping[str, Any], cp: CheckpointRecord) -> None:
    """``dead_letters`` when ``cp`` (just committed) sent more records to the dead-letter
    topic than the pipeline's ``notify_dead_letters_above``."""
    dead = int(cp.dead_letters or 0)
    if dead > pipeline.notify_dead_letters_above:
        notify(
            pipeline,
            "dead_letters",
            context,
            checkpoint_id=cp.checkpoint_id,
            reason=(
                f"checkpoint {cp.checkpoint_id} sent {dead} record(s) to {pipeline.dead_letter_topic}, "
                f"more than {pipeline.notify_dead_letters_above}"
            ),
            dead_letters=dead,
            records=cp.records,
            dead_letter_topic=pipeline.dead_letter_topic,
        )
