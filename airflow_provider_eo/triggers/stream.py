"""Triggers of streaming mode.

- :class:`EoPreparedCheckpointTrigger`, an event trigger for an Airflow 3 ``AssetWatcher``: a
  streaming application running with ``commit="airflow"`` left a checkpoint PREPARED, so the
  commit DAG should run.
- :class:`EoStreamRunTrigger`: tracks a detached streaming driver through its run's row in
  the ledger (``EoStreamOperator(deferrable=True)``).
- :class:`EoStreamCommitsTrigger`, an event trigger for the sink asset's ``AssetWatcher``:
  one asset event per checkpoint a streaming application committed itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.triggers.checkpoint import (
    check_ledger_ref,
    ledger_reader,
    resolve_ledger_url,
    watch_pipeline,
)
from airflow_provider_eo.version_compat import BaseEventTrigger, BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import CheckpointRecord, Ledger
    from airflow_provider_eo.ledger.watches import StreamCommitter
    from airflow_provider_eo.pipeline import Pipeline


def read_prepared(ledger_url: str, pipeline: str) -> list[int]:
    """Ids of the pipeline's PREPARED checkpoints, lowest first; blocking, read-only. A
    pipeline the ledger does not know yet has none."""
    from airflow_provider_eo.core.stream import unfinished_checkpoints
    from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState

    try:
        unfinished = unfinished_checkpoints(ledger_reader(ledger_url), pipeline)
    except CheckpointNotFound:
        return []
    return [cp.checkpoint_id for cp in unfinished if cp.state is CheckpointState.PREPARED]


class EoPreparedCheckpointTrigger(BaseEventTrigger):
    """Watch the ledger, read-only, and fire one event per checkpoint that became PREPARED.

    Meant for an ``AssetWatcher``: every event is an asset event, and the DAG scheduled on
    the asset commits the lowest PREPARED checkpoint (one run per event; the commit is
    idempotent, so a repeated event costs a run that finds nothing to do). The trigger
    runs for as long as the watcher exists and never writes.

    Events: ``{"status": "prepared", "pipeline", "checkpoint_id"}``. Within one run of the
    trigger each checkpoint fires once; after a triggerer restart the checkpoints still
    PREPARED fire again (their commit runs are no-ops once committed).

    :param pipeline: pipeline name (as recorded in the ledger).
    :param ledger_url: SQLAlchemy URL of the ledger, without a password.
    :param ledger_conn_id: or the Airflow connection of the ledger, looked up in the
        triggerer (exactly one of the two).
    :param poll_interval: seconds between reads.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 2.0,
    ) -> None:
        super().__init__()
        check_ledger_ref(ledger_url, ledger_conn_id, where=f"pipeline {pipeline!r}")
        self.pipeline = pipeline
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "ledger_url": self.ledger_url,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        fired: set[int] = set()
        url = await asyncio.to_thread(resolve_ledger_url, self.ledger_url, self.ledger_conn_id)
        while True:
            try:
                prepared = await asyncio.to_thread(read_prepared, url, self.pipeline)
            except LedgerError as exc:
                self.log.warning(
                    "pipeline %r: cannot read the ledger (%s); polling again", self.pipeline, exc
                )
                prepared = []
            for cid in prepared:
                if cid not in fired:
                    fired.add(cid)
                    yield TriggerEvent(
                        {"status": "prepared", "pipeline": self.pipeline, "checkpoint_id": cid}
                    )
            # Forget what is no longer PREPARED (committed or aborted): bounded memory.
            fired.intersection_update(prepared)
            await asyncio.sleep(self.poll_interval)


def read_stream_run(ledger_url: str, run_id: str) -> dict[str, Any] | None:
    """The stream run's row as JSON (``heartbeat_age_s`` on the database's clock), None while
    it is not registered; blocking, read-only."""
    from airflow_provider_eo.ledger.streams import StreamRunNotFound

    try:
        return ledger_reader(ledger_url).get_stream_run(run_id).to_json()
    except StreamRunNotFound:
        return None


def stream_run_event(
    run: dict[str, Any] | None, *, waited_s: float, startup_timeout: float
) -> dict[str, Any] | None:
    """The event a run's row calls for, None while it runs (pure: unit-tested).

    - ENDED: ``success`` with the run (its summary inside);
    - FAILED / LOST: ``failed`` with the run (its error / why inside);
    - RUNNING but silent for more than ``STALE_FACTOR`` heartbeats: ``lost`` (the driver was
      killed without ending its row: SIGKILL, OOM, its host went away);
    - not registered after ``startup_timeout`` seconds: ``failed`` (it never started).
    """
    from airflow_provider_eo.ledger.streams import ENDED, RUNNING, STALE_FACTOR

    if run is None:
        if waited_s > startup_timeout:
            return {
                "status": "failed",
                "reason": f"the streaming application did not register its run within {startup_timeout:.0f}s "
                "(spark-submit failed or is still waiting for resources; see its log)",
                "run": None,
            }
        return None
    if run["state"] == ENDED:
        return {"status": "success", "reason": run["reason"], "run": run}
    if run["state"] != RUNNING:
        return {"status": "failed", "reason": run["reason"], "run": run}
    age = run.get("heartbeat_age_s")
    if age is not None and age > STALE_FACTOR * float(run["heartbeat_s"]):
        return {
            "status": "lost",
            "reason": f"no heartbeat for {age:.0f}s (the driver was killed without ending its run)",
            "run": run,
        }
    return None


class EoStreamRunTrigger(BaseTrigger):
    """Track one run of a streaming application through its ledger row (read-only), so the
    task that started a detached driver holds no worker slot while it runs.

    Fires once: ``success`` (the run ENDED: exit 0, its summary), ``failed`` (FAILED with the
    driver's error, never registered within ``startup_timeout``, or the ledger unreadable for
    longer than that) or ``lost`` (its heartbeat went stale). When a user marks the waiting
    task failed/success or clears it, Airflow calls :meth:`on_kill`, which asks the run to stop
    cleanly (the ledger's stop request: in-flight checkpoints finish, nothing is left half
    done).

    :param pipeline: pipeline name.
    :param run_id: the run's id (``eo_stream_runs``).
    :param ledger_url: ledger URL without a password, or ``ledger_conn_id`` (exactly one).
    :param poll_interval: seconds between reads.
    :param startup_timeout: seconds the run may take to register (spark-submit, resources).
    :param submitted_at: epoch seconds when the driver was started (startup timeout base).
    """

    def __init__(
        self,
        *,
        pipeline: str,
        run_id: str,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 5.0,
        startup_timeout: float = 600.0,
        submitted_at: float | None = None,
    ) -> None:
        super().__init__()
        check_ledger_ref(ledger_url, ledger_conn_id, where=f"pipeline {pipeline!r}")
        self.pipeline = pipeline
        self.run_id = run_id
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)
        self.startup_timeout = float(startup_timeout)
        self.submitted_at = time.time() if submitted_at is None else float(submitted_at)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "run_id": self.run_id,
                "ledger_url": self.ledger_url,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
                "startup_timeout": self.startup_timeout,
                "submitted_at": self.submitted_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        url = await asyncio.to_thread(resolve_ledger_url, self.ledger_url, self.ledger_conn_id)
        unreadable_since: float | None = None
        while True:
            try:
                run = await asyncio.to_thread(read_stream_run, url, self.run_id)
            except LedgerError as exc:
                # A blip is waited out; a ledger gone for longer than the startup timeout
                # fails the task (a retry re-attaches to the run if it still beats).
                unreadable_since = unreadable_since or time.time()
                down_s = time.time() - unreadable_since
                if down_s > self.startup_timeout:
                    yield TriggerEvent(
                        {
                            "pipeline": self.pipeline,
                            "run_id": self.run_id,
                            "status": "failed",
                            "reason": f"the ledger could not be read for {down_s:.0f}s ({exc})",
                            "run": None,
                        }
                    )
                    return
                self.log.warning(
                    "pipeline %r, stream run %s: cannot read the ledger (%s); polling again",
                    self.pipeline,
                    self.run_id,
                    exc,
                )
            else:
                unreadable_since = None
                event = stream_run_event(
                    run, waited_s=time.time() - self.submitted_at, startup_timeout=self.startup_timeout
                )
                if event is not None:
                    yield TriggerEvent({"pipeline": self.pipeline, "run_id": self.run_id, **event})
                    return
            await asyncio.sleep(self.poll_interval)

    async def on_kill(self) -> None:
        """The waiting task was marked failed/success or cleared: ask the run to stop."""
        asked = await asyncio.to_thread(self._request_stop)
        self.log.info("pipeline %r: asked stream run(s) %s to stop", self.pipeline, asked)

    def _request_stop(self) -> list[str]:
        from airflow_provider_eo.ledger import Ledger

        url = resolve_ledger_url(self.ledger_url, self.ledger_conn_id)
        with Ledger(url, create=False) as ledger:
            return list(
                ledger.request_stream_stop(
                    self.pipeline, requested_by="airflow: the waiting task was stopped", run_id=self.run_id
                )
            )


#: The watch mark's name of the stream-commit announcer.
STREAM_COMMITS_WATCH = "stream_commits"


def announcement_steps(
    checkpoints: list[CheckpointRecord], committers: list[StreamCommitter]
) -> list[tuple[int, CheckpointRecord | None]]:
    """How the stream-commit announcer moves through ``checkpoints`` (those after its mark,
    lowest id first): steps ``(through id, checkpoint to announce or None)`` (pure).

    A COMMITTED checkpoint that one of ``committers`` (the pipeline's ``commit="inline"``
    stream runs) committed is announced, one step each; one committed by anyone else (a
    commit task, which announces it on its own outlets) and an ABORTED one are passed over,
    consecutive ones in one step. The walk stops at the first unfinished checkpoint:
    checkpoints commit in id order, so nothing after it is committed yet.
    """
    from airflow_provider_eo.ledger import CheckpointState

    steps: list[tuple[int, CheckpointRecord | None]] = []
    for cp in checkpoints:
        if cp.state is CheckpointState.COMMITTED and any(r.committed(cp) for r in committers):
            steps.append((cp.checkpoint_id, cp))
        elif cp.state in (CheckpointState.COMMITTED, CheckpointState.ABORTED):
            if steps and steps[-1][1] is None:
                steps[-1] = (cp.checkpoint_id, None)
            else:
                steps.append((cp.checkpoint_id, None))
        else:
            break
    return steps


def initial_mark(ledger: Ledger, pipeline: str) -> int:
    """Where the announcer of a pipeline starts the first time it runs: after the newest
    finished checkpoint below the lowest unfinished one (so a checkpoint a stream has in
    flight is announced when it commits); 0 for a pipeline the ledger does not know yet."""
    from airflow_provider_eo.ledger import CheckpointNotFound

    try:
        lowest = ledger.unfinished(pipeline)
        return lowest.checkpoint_id - 1 if lowest is not None else ledger.newest_checkpoint_id(pipeline)
    except CheckpointNotFound:
        return 0


class EoStreamCommitsTrigger(BaseEventTrigger):
    """Announce each checkpoint a streaming application committed as an asset event on the
    pipeline's sink asset (``sink_asset(..., stream_commits=True)`` in
    :mod:`airflow_provider_eo.assets` builds the watcher).

    A stream with ``commit="inline"`` commits in its Spark driver, not in an Airflow task, so
    no task outlet announces its checkpoints; this trigger reads the ledger and fires one
    event per such checkpoint, lowest id first, whose payload is
    :func:`~airflow_provider_eo.assets.checkpoint_extra` (what a commit task's event carries
    as its ``extra``; Airflow puts a trigger's payload in the asset event's ``extra`` under
    ``"payload"``, next to ``"from_trigger": true``). Checkpoints a commit task committed are
    passed over (that task announces them, when its sink outlet is set), and so are aborted
    ones.

    Restarts: the last checkpoint announced is the ledger's watch mark, moved with a
    compare-and-set *before* each event is yielded: no checkpoint is announced twice, even by
    two copies of the trigger, and checkpoints committed while the triggerer was down are
    announced when it is back, in order. The one loss: a triggerer killed between moving the
    mark and handing the event to Airflow loses that one event (the mark says announced).
    The first time it runs for a pipeline it starts after the pipeline's newest finished
    checkpoint (below any unfinished one): history is not announced.

    :param pipeline: ``"module:ATTR"`` of the pipeline (imported in the triggerer: the sink
        topic and dead-letter settings are part of the event).
    :param ledger_conn_id: an ``eo_ledger`` connection replacing the pipeline's ledger URL
        (default: the pipeline's own; no password travels in the kwargs either way).
    :param poll_interval: seconds between reads of the ledger.
    :param settings: the pipeline's
        :meth:`~airflow_provider_eo.pipeline.Pipeline.public_settings`, for a triggerer that
        cannot import its module (Airflow's triggerer does not load DAG bundles;
        :func:`~airflow_provider_eo.assets.sink_asset` records them).
    :param withheld: the settings ``settings`` left out (secrets), for connections to supply.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        ledger_conn_id: str | None = None,
        poll_interval: float = 5.0,
        settings: str | None = None,
        withheld: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if ":" not in pipeline:
            raise ValueError(
                f"pipeline {pipeline!r}: the stream-commit watcher takes the pipeline's "
                "'module:ATTR' reference (imported in the triggerer), not its name"
            )
        self.pipeline = pipeline
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)
        self.settings = settings
        self.withheld = list(withheld)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
                "settings": self.settings,
                "withheld": self.withheld,
            },
        )

    def _resolve(self) -> Pipeline:
        from airflow_provider_eo.triggers.checkpoint import resolve_watched

        # The watcher reads only the ledger: the Kafka settings' secrets are not needed.
        withheld = [key for key in self.withheld if key == "ledger_url.password"]
        return resolve_watched(
            self.pipeline,
            self.settings,
            withheld,
            kafka_conn_id=None,
            ledger_conn_id=self.ledger_conn_id,
            log=self.log,
        )

    def poll(self, pipeline: Pipeline) -> list[dict[str, Any]]:
        """Claim and return the next payload to announce (blocking): at most one, so at most
        one claimed event is in flight between the ledger and Airflow; empty when there is
        none. The caller polls again at once after an announcement."""
        from airflow_provider_eo.checkpoint_event import checkpoint_extra
        from airflow_provider_eo.ledger import CheckpointNotFound
        from airflow_provider_eo.triggers.source import watch_ledger

        ledger = watch_ledger(pipeline.ledger_url)
        mark = ledger.get_watch_mark(pipeline.name, STREAM_COMMITS_WATCH)
        if mark.seq == 0:
            start = initial_mark(ledger, pipeline.name)
            ledger.claim_watch_mark(pipeline.name, STREAM_COMMITS_WATCH, seq=0, state={"through": start})
            return []  # read again next poll, from the mark as stored (another copy may have won)
        through = int(mark.state["through"])
        try:
            after = ledger.checkpoints_after(pipeline.name, through)
            committers = ledger.stream_committers(pipeline.name) if after else []
        except CheckpointNotFound:
            return []
        out: list[dict[str, Any]] = []
        seq = mark.seq
        for step_through, cp in announcement_steps(after, committers):
            if not ledger.claim_watch_mark(
                pipeline.name, STREAM_COMMITS_WATCH, seq=seq, state={"through": step_through}
            ):
                break  # another copy moved the mark: it announces from here
            seq += 1
            if cp is not None:
                out.append(checkpoint_extra(pipeline, cp))
                break
        return out

    async def run(self) -> AsyncIterator[TriggerEvent]:
        def poll(pipeline: Pipeline) -> list[TriggerEvent]:
            events = []
            for payload in self.poll(pipeline):
                self.log.info(
                    "pipeline %r: announcing checkpoint %s committed by a stream",
                    payload["pipeline"],
                    payload["checkpoint_id"],
                )
                events.append(TriggerEvent(payload))
            return events

        # After an announcement the next one is read at once.
        async for event in watch_pipeline(
            self, f"stream-commit watcher of {self.pipeline!r}", poll, pause_after_events=False
        ):
            yield event
