"""The source watcher: an event trigger that fires when a pipeline's source topics hold
records its ledger has not planned yet, for an Airflow ``AssetWatcher`` (see
:func:`airflow_provider_eo.assets.source_asset`), so a pipeline DAG runs when there is
data instead of on a timetable.

How Airflow runs it (Airflow 3.x triggerer): the trigger's ``run()`` is an async generator
that the triggerer keeps iterating after each event; every event becomes one asset event
whose ``extra`` is ``{"from_trigger": true, "payload": <the event's payload>}``. A
restarted triggerer (or one taking over the trigger) builds the trigger again from its
kwargs: nothing in the generator's memory survives. So what the watcher last fired for is
kept in the ledger (``eo_watch_marks``, :mod:`airflow_provider_eo.ledger.watches`).

The decision (:func:`decide_source_fire`, pure) compares, per source partition, the
**source end** (the last stable offset, read with ``read_committed`` isolation: the end
the planner uses, so a plan made after the event covers everything the event saw) with
the **planned end** (where the ledger's next checkpoint starts). It fires when some source
end is beyond its planned end and

1. the watch never fired for this pipeline, or
2. the planned position differs from the one recorded at its last firing (a run planned
   since: what is still beyond it is new work, e.g. what a capped checkpoint left), or
3. the planned position has not moved for ``refire_after`` seconds since its last firing
   (the run it caused failed before planning, or the event was lost with a triggerer that
   died between recording the firing and handing the event to Airflow).

With no records beyond the planned position it fires only for an unfinished checkpoint
(PLANNED or PREPARED) when the watch never fired or last fired ``refire_after`` ago: a run
that failed after planning left it, and the next run resumes it (a run still working on
it is left alone until then). Otherwise it stays silent: an idle source, a stopped pipeline
(``eo stop``), or data already fired for whose run has not planned yet.

What is guaranteed, with the mark in the ledger:

- no second event for a planned position while the run of the first has not planned,
  across triggerer restarts and with two copies of the trigger running at once (the
  firing is claimed with a compare-and-set on the mark before the event is yielded);
- nothing is stranded: records produced while the triggerer is down are seen by its first
  poll after the restart (positions are read afresh, never remembered), and at most
  ``refire_after`` after a firing whose run did not plan, or whose checkpoint stays
  unfinished, another event follows;
- a partition the ledger does not know yet: with ``earliest`` startup (or once the ledger
  knows other partitions of the pipeline) it counts from its log start, as the planner
  does; with any other startup policy the first plan must pin the start, so the watcher
  fires once for it.

Read-only on Kafka: metadata and ``ListOffsets`` through a shared AdminClient (no consumer,
no group, no offset commit). The only ledger write is the watch mark.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.version_compat import BaseEventTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import Pipeline

TP = tuple[str, int]

#: The watch mark's name of the source watcher.
SOURCE_WATCH = "source"
#: Seconds without a plan after a firing before the watcher fires again.
DEFAULT_REFIRE_AFTER_S = 600.0
#: Seconds a Kafka metadata or offsets request may take in one poll.
KAFKA_TIMEOUT_S = 15.0


def positions(ends: Mapping[TP, int | None]) -> list[list[Any]]:
    """Per-partition offsets as sorted JSON rows ``[topic, partition, offset]``: how a
    position is recorded in the watch mark and compared with it."""
    return [[t, p, ends[(t, p)]] for t, p in sorted(ends)]


@dataclass(frozen=True)
class SourceDecision:
    """Whether to fire, why, and the partitions whose source end is beyond the planned end."""

    fire: bool
    reason: str
    pending: list[TP] = field(default_factory=list)


def decide_source_fire(
    *,
    source_ends: Mapping[TP, int],
    planned_ends: Mapping[TP, int | None],
    fired_planned: list[list[Any]] | None,
    fired_age_s: float | None,
    refire_after: float,
    stopped: bool = False,
    unfinished: bool = False,
) -> SourceDecision:
    """The source watcher's decision (pure; see the module docstring).

    :param source_ends: the last stable offset of each source partition.
    :param planned_ends: where the next checkpoint of each partition starts; ``None`` for a
        partition whose start only a plan can pin (its records count as pending).
    :param fired_planned: the planned position recorded at the last firing
        (:func:`positions`), ``None`` when the watch never fired.
    :param fired_age_s: seconds since the last firing (``None``: never).
    :param refire_after: seconds without a plan after which a firing is repeated.
    :param stopped: the pipeline is stopped (``eo stop``): its runs would only skip.
    :param unfinished: the ledger holds an unfinished (PLANNED/PREPARED) checkpoint: with no
        records pending, it fires for it only when the watch never fired or last fired
        ``refire_after`` ago (its run failed after planning; a run still working on it
        is left alone until then).
    """
    pending = [
        tp
        for tp in sorted(source_ends)
        if (planned := planned_ends.get(tp)) is None or source_ends[tp] > planned
    ]
    if stopped:
        return SourceDecision(False, "the pipeline is stopped", pending)
    if not pending:
        if unfinished and (fired_age_s is None or fired_age_s >= refire_after):
            return SourceDecision(True, "an unfinished checkpoint and no event for refire_after", pending)
        return SourceDecision(False, "no records beyond the planned position", pending)
    if fired_planned is None:
        return SourceDecision(True, "records beyond the planned position", pending)
    if positions(planned_ends) != fired_planned:
        return SourceDecision(True, "a run planned since the last event and records remain", pending)
    if fired_age_s is not None and fired_age_s >= refire_after:
        return SourceDecision(
            True,
            f"no plan in {fired_age_s:.0f}s since the last event (refire_after={refire_after:.0f}s)",
            pending,
        )
    return SourceDecision(False, "waiting for the run of the last event to plan", pending)


def read_source_ends(
    pipeline: Pipeline, *, known: Mapping[TP, int]
) -> tuple[dict[TP, int], dict[TP, int | None]]:
    """``(source ends, planned ends)`` of every source partition; blocking, read-only.

    Source ends are the last stable offsets (:func:`airflow_provider_eo.kafka.admin.list_offsets`
    ``latest``: ``read_committed``, the planner's end). ``known`` is the ledger's next start
    per partition; a partition it lacks gets its log start (``earliest`` startup, or a
    partition found after the pipeline's first plan, as the planner starts it) or ``None``.
    """
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.client_config import librdkafka_config

    config = librdkafka_config(pipeline.kafka)
    topics = admin.partitions_of(config, pipeline.source_topics, timeout_s=KAFKA_TIMEOUT_S)
    partitions = [(t, p) for t, ps in sorted(topics.items()) for p in ps]
    ends = admin.list_offsets(config, partitions, spec="latest", timeout_s=KAFKA_TIMEOUT_S)
    planned: dict[TP, int | None] = {tp: known[tp] for tp in partitions if tp in known}
    unknown = [tp for tp in partitions if tp not in known]
    if unknown and (known or pipeline.startup.mode == "earliest"):
        planned.update(admin.list_offsets(config, unknown, spec="earliest", timeout_s=KAFKA_TIMEOUT_S))
    else:
        planned.update({tp: None for tp in unknown})
    return ends, planned


def read_planned(ledger: Ledger, pipeline: str) -> tuple[dict[TP, int], bool, bool]:
    """``(next start per partition, stopped, an unfinished checkpoint exists)`` from the
    ledger; a pipeline it does not know yet has no starts and is neither."""
    from airflow_provider_eo.ledger import CheckpointNotFound

    try:
        return (
            dict(ledger.next_starts(pipeline)),
            ledger.get_pipeline(pipeline).stopped,
            ledger.unfinished(pipeline) is not None,
        )
    except CheckpointNotFound:
        return {}, False, False


class EoSourceRecordsTrigger(BaseEventTrigger):
    """Fire when ``pipeline``'s source topics hold stable records beyond the ledger's planned
    position (see the module docstring for the rule and its guarantees).

    For an ``AssetWatcher`` on the pipeline's source asset
    (:func:`airflow_provider_eo.assets.source_asset` builds both); the DAG scheduled on the
    asset runs the pipeline (plan, prepare, commit). The trigger runs for as long as the
    watcher exists.

    Events: ``{"status": "source_records", "pipeline", "fire", "reason", "partitions":
    [{"topic", "partition", "source_end", "planned_end"}, ...], "pending"}``; ``fire`` is the
    firing's number in the ledger's watch mark (the event's identity), ``pending`` the
    offsets beyond the planned ends (``null`` when a partition's start is not pinned yet).

    Kwargs carry no secret: the pipeline is imported, and its connections looked up, in the
    triggerer; where its module cannot be imported (Airflow's triggerer does not load DAG
    bundles), the settings recorded when the DAG was parsed serve, secrets left out
    (:func:`~airflow_provider_eo.triggers.checkpoint.resolve_watched`).

    :param pipeline: ``"module:ATTR"`` of the pipeline.
    :param kafka_conn_id: a ``kafka`` connection applied over the pipeline's Kafka settings
        (default: the pipeline's own).
    :param ledger_conn_id: an ``eo_ledger`` connection replacing the pipeline's ledger URL
        (default: the pipeline's own).
    :param poll_interval: seconds between polls (each: one metadata and one offsets request
        to Kafka, two small ledger reads).
    :param refire_after: seconds without a plan after a firing before firing again; longer
        than a run usually waits before its plan task (queued behind a running one).
    :param settings: the pipeline's
        :meth:`~airflow_provider_eo.pipeline.Pipeline.public_settings`, for a triggerer that
        cannot import its module (:func:`~airflow_provider_eo.assets.source_asset` records them).
    :param withheld: the settings ``settings`` left out (secrets), for connections to supply.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 5.0,
        refire_after: float = DEFAULT_REFIRE_AFTER_S,
        settings: str | None = None,
        withheld: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if ":" not in pipeline:
            raise ValueError(
                f"pipeline {pipeline!r}: the source watcher takes the pipeline's 'module:ATTR' "
                "reference (imported in the triggerer), not its name"
            )
        if float(poll_interval) <= 0 or float(refire_after) <= 0:
            raise ValueError(
                f"pipeline {pipeline!r}: poll_interval and refire_after must be positive seconds "
                f"(got {poll_interval!r}, {refire_after!r})"
            )
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)
        self.refire_after = float(refire_after)
        self.settings = settings
        self.withheld = list(withheld)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "kafka_conn_id": self.kafka_conn_id,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
                "refire_after": self.refire_after,
                "settings": self.settings,
                "withheld": self.withheld,
            },
        )

    def _resolve(self) -> Pipeline:
        from airflow_provider_eo.triggers.checkpoint import resolve_watched

        return resolve_watched(
            self.pipeline,
            self.settings,
            self.withheld,
            kafka_conn_id=self.kafka_conn_id,
            ledger_conn_id=self.ledger_conn_id,
            log=self.log,
        )

    def poll(self, pipeline: Pipeline) -> TriggerEvent | None:
        """One poll (blocking): read, decide, and when firing claim the firing in the ledger;
        the event to yield, else None."""
        ledger = watch_ledger(pipeline.ledger_url)
        mark = ledger.get_watch_mark(pipeline.name, SOURCE_WATCH)
        known, stopped, unfinished = read_planned(ledger, pipeline.name)
        source, planned = read_source_ends(pipeline, known=known)
        fired = mark.state.get("planned") if mark.seq else None
        decision = decide_source_fire(
            source_ends=source,
            planned_ends=planned,
            fired_planned=fired,
            fired_age_s=mark.age_s,
            refire_after=self.refire_after,
            stopped=stopped,
            unfinished=unfinished,
        )
        if not decision.fire:
            self.log.debug("pipeline %r: %s", pipeline.name, decision.reason)
            return None
        state = {"planned": positions(planned), "source": positions(source), "reason": decision.reason}
        if not ledger.claim_watch_mark(pipeline.name, SOURCE_WATCH, seq=mark.seq, state=state):
            self.log.info("pipeline %r: another copy of the source watcher fired first", pipeline.name)
            return None
        pending = sum(source[tp] - (planned[tp] or 0) for tp in decision.pending if planned[tp] is not None)
        payload = {
            "status": "source_records",
            "pipeline": pipeline.name,
            "fire": mark.seq + 1,
            "reason": decision.reason,
            "partitions": [
                {"topic": t, "partition": p, "source_end": source[(t, p)], "planned_end": planned[(t, p)]}
                for t, p in sorted(source)
            ],
            "pending": None if any(planned[tp] is None for tp in decision.pending) else pending,
        }
        self.log.info(
            "pipeline %r: firing (%s): %s offsets beyond the planned position",
            pipeline.name,
            decision.reason,
            pending,
        )
        return TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.triggers.checkpoint import watch_pipeline

        def poll(pipeline: Pipeline) -> list[TriggerEvent]:
            event = self.poll(pipeline)
            return [] if event is None else [event]

        async for event in watch_pipeline(
            self, f"source watcher of {self.pipeline!r}", poll, pause_after_events=True
        ):
            yield event


_WATCH_LEDGERS: dict[str, Ledger] = {}
_WATCH_LEDGERS_LOCK = threading.Lock()


def watch_ledger(ledger_url: str) -> Ledger:
    """One :class:`~airflow_provider_eo.ledger.Ledger` per URL per process for the watchers
    (they write their watch marks, so it is opened as the tasks open it: a SQLite ledger is
    created and migrated on first use, another must be at the schema this package needs)."""
    with _WATCH_LEDGERS_LOCK:
        ledger = _WATCH_LEDGERS.get(ledger_url)
        if ledger is None:
            from airflow_provider_eo.ledger import Ledger

            ledger = _WATCH_LEDGERS[ledger_url] = Ledger(ledger_url)
        return ledger
