"""Triggers that wait, in the triggerer, on the ledger: one checkpoint PREPARED or
COMMITTED (:class:`EoCheckpointTrigger`), or any checkpoint committed after a time
(:class:`EoCommittedAfterTrigger`, the streaming mode's freshness wait)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.version_compat import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import Pipeline

DONE_STATES = frozenset({"PREPARED", "COMMITTED"})
WaitFor = Literal["prepared", "committed"]
WAIT_FOR: tuple[WaitFor, ...] = ("prepared", "committed")


#: Consecutive failures to load a watcher's pipeline before it yields an error event.
RESOLVE_TRIES = 5
#: Seconds between a watcher's error events while its pipeline still cannot be loaded.
RESOLVE_RETRY_S = 600.0


def resolve_watched(
    ref: str,
    settings: str | None,
    withheld: Sequence[str],
    *,
    kafka_conn_id: str | None,
    ledger_conn_id: str | None,
    log: Any,
) -> Pipeline:
    """The pipeline an asset watcher watches, with its connections applied (blocking).

    The module ``ref`` names is imported when it can be: it is the pipeline's definition,
    secrets in code included. Airflow's triggerer does not load DAG bundles, so a pipeline
    module kept with the DAGs is not importable there: then the watcher runs on ``settings``,
    the pipeline's :meth:`~airflow_provider_eo.pipeline.Pipeline.public_settings` recorded
    when the DAG was parsed, as long as connections can supply what they left out
    (``withheld``). Otherwise :class:`~airflow_provider_eo.errors.WatcherSetupError` names
    what is missing and what to do.
    """
    from airflow_provider_eo.errors import WatcherSetupError
    from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError, load_pipeline
    from airflow_provider_eo.runtime import resolve_pipeline

    try:
        pipeline = load_pipeline(ref)
    except PipelineConfigError as exc:
        if not isinstance(exc.__cause__, ImportError):
            raise WatcherSetupError(str(exc)) from exc
        if settings is None:
            raise WatcherSetupError(
                f"{exc}. The watcher runs in Airflow's triggerer, which does not load DAG bundles: "
                "install the pipeline's module where the triggerer runs (or put it on its "
                "PYTHONPATH), or build the asset again with this version of the provider, whose "
                "watchers carry the pipeline's settings"
            ) from exc
        pipeline = Pipeline.from_json(settings)
        kafka_by_connection = bool(kafka_conn_id or pipeline.kafka_conn_id)
        ledger_by_connection = bool(ledger_conn_id or pipeline.ledger_conn_id)
        missing = [
            key
            for key in withheld
            if not (ledger_by_connection if key == "ledger_url.password" else kafka_by_connection)
        ]
        if missing:
            raise WatcherSetupError(
                f"pipeline {pipeline.name!r}: {exc}, and the settings recorded when the DAG was "
                f"parsed leave out secrets ({', '.join(missing)}) that no connection supplies "
                "here. Name the Kafka cluster and the ledger by connection (kafka_conn_id / "
                "ledger_conn_id on the pipeline or the asset), or install the pipeline's module "
                "where the triggerer runs"
            ) from exc
        log.info(
            "pipeline %r: %s; watching with the settings recorded when the DAG was parsed",
            pipeline.name,
            exc,
        )
    try:  # the connections as every entry point applies them (runtime.resolve_pipeline)
        return resolve_pipeline(pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id).pipeline
    except ConfigError as exc:  # a connection not defined where the triggerer runs
        raise WatcherSetupError(str(exc)) from exc


async def watch_pipeline(
    trigger: Any,
    what: str,
    poll: Callable[[Pipeline], list[TriggerEvent]],
    *,
    pause_after_events: bool,
) -> AsyncIterator[TriggerEvent]:
    """The loop of a pipeline's asset watcher: resolve the pipeline once (``trigger._resolve``,
    in a thread), then ``poll`` it (blocking, in a thread) every ``trigger.poll_interval``
    seconds and yield its events. An unreachable ledger or cluster is logged and polled
    again. ``pause_after_events=False``: after events, poll again at once (one claimed event
    in flight at a time).

    A pipeline that cannot be loaded (:class:`~airflow_provider_eo.errors.WatcherSetupError`,
    see :func:`resolve_watched`) is tried :data:`RESOLVE_TRIES` times, ``poll_interval``
    apart; then the watcher yields an error event, ``{"status": "error", "watcher",
    "pipeline", "error"}``: the DAG run it starts fails in its plan task with that error (and
    :func:`~airflow_provider_eo.assets.event_checkpoint` raises it in a downstream DAG), so
    the failure shows in Airflow instead of only in the triggerer's log. It tries again
    :data:`RESOLVE_RETRY_S` later, at most one error event per that time."""
    from airflow_provider_eo.errors import EoError, WatcherSetupError

    pipeline: Pipeline | None = None
    failures = 0
    while True:
        if pipeline is None:
            try:
                resolved: Pipeline = await asyncio.to_thread(trigger._resolve)
            except WatcherSetupError as exc:
                failures += 1
                trigger.log.warning("%s: %s (try %d of %d)", what, exc, failures, RESOLVE_TRIES)
                if failures < RESOLVE_TRIES:
                    await asyncio.sleep(trigger.poll_interval)
                    continue
                failures = 0
                yield TriggerEvent(
                    {"status": "error", "watcher": what, "pipeline": trigger.pipeline, "error": str(exc)}
                )
                await asyncio.sleep(RESOLVE_RETRY_S)
                continue
            pipeline = resolved
        try:
            events = await asyncio.to_thread(poll, pipeline)
        except (EoError, OSError) as exc:
            trigger.log.warning("%s: %s; polling again", what, exc)
            events = []
        for event in events:
            yield event
        if pause_after_events or not events:
            await asyncio.sleep(trigger.poll_interval)


def watcher_error(extra: Mapping[str, Any] | None) -> str | None:
    """The error an eo asset watcher's event reports (:func:`watch_pipeline`), from an asset
    event's ``extra`` (a trigger's payload sits under ``"payload"``); None for any other event."""
    payload = dict(extra or {}).get("payload")
    if isinstance(payload, Mapping) and payload.get("status") == "error" and "watcher" in payload:
        return f"{payload['watcher']} could not run: {payload.get('error')}"
    return None


def done_states(wait_for: str) -> frozenset[str]:
    """The states that end a wait for ``wait_for`` (``"prepared"``: PREPARED or COMMITTED;
    ``"committed"``: COMMITTED only). ValueError for anything else."""
    if wait_for not in WAIT_FOR:
        raise ValueError(f"wait_for must be one of {WAIT_FOR}, got {wait_for!r}")
    return DONE_STATES if wait_for == "prepared" else frozenset({"COMMITTED"})


def as_utc(value: dt.datetime | str) -> dt.datetime:
    """An aware UTC datetime from a datetime or an ISO-8601 string (naive means UTC)."""
    moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc)


def check_ledger_ref(ledger_url: str | None, ledger_conn_id: str | None, *, where: str) -> None:
    """A trigger names its ledger by connection id (resolved in the triggerer) or by a URL
    without a password: its kwargs are stored in Airflow's metadata database and shown in
    the UI, so a password must never travel in them. ValueError otherwise."""
    from sqlalchemy.engine import make_url

    if (ledger_url is None) == (ledger_conn_id is None):
        raise ValueError(f"{where}: give exactly one of ledger_url and ledger_conn_id")
    if ledger_url is not None and make_url(ledger_url).password:
        raise ValueError(
            f"{where}: the ledger URL carries a password, which a trigger must not store; give "
            "the task a ledger_conn_id (an eo_ledger or postgres connection) instead"
        )


_READERS: dict[str, Ledger] = {}
_READERS_LOCK = threading.Lock()


def ledger_reader(ledger_url: str) -> Ledger:
    """One read-only :class:`~airflow_provider_eo.ledger.Ledger` (one engine, one connection
    pool) per ledger URL per process, shared by every trigger and poke of that process: a
    watcher polling every 2 s reuses its pooled connection instead of opening (and
    disposing) an engine per poll. Thread-safe: triggers read it in worker threads."""
    with _READERS_LOCK:
        reader = _READERS.get(ledger_url)
        if reader is None:
            from airflow_provider_eo.ledger import Ledger

            reader = _READERS[ledger_url] = Ledger(ledger_url, create=False)
        return reader


def close_ledger_readers() -> None:
    """Dispose of every shared reader's connections (a process that is done with them; the
    tests, before a ledger database is dropped)."""
    with _READERS_LOCK:
        readers = list(_READERS.values())
        _READERS.clear()
    for reader in readers:
        reader.close()


def resolve_ledger_url(ledger_url: str | None, ledger_conn_id: str | None) -> str:
    """The ledger URL a trigger reads: its own (password-free) URL, or the connection's,
    looked up where the trigger runs (blocking: call it in a worker thread)."""
    if ledger_conn_id is not None:
        from airflow_provider_eo.hooks.ledger import LedgerHook

        return LedgerHook(ledger_conn_id, create=False).get_url()
    assert ledger_url is not None
    return ledger_url


def read_committed_after(ledger_url: str, pipeline: str, after: dt.datetime) -> tuple[int, str] | None:
    """``(checkpoint_id, committed_at ISO)`` of the newest COMMITTED checkpoint when it was
    committed after ``after`` (aware), else ``None``; blocking, read-only. Checkpoints
    commit in id order, so the newest committed one is the last to have committed. A
    pipeline the ledger does not know yet reads as ``None`` (the stream may not have
    started)."""
    from airflow_provider_eo.ledger import CheckpointNotFound

    try:
        cp = ledger_reader(ledger_url).last_committed(pipeline)
    except CheckpointNotFound:  # the pipeline is not registered yet
        return None
    if cp is None or cp.committed_at is None or as_utc(cp.committed_at) <= as_utc(after):
        return None
    return cp.checkpoint_id, as_utc(cp.committed_at).isoformat()


# The state read reports a checkpoint the ledger does not hold as this pseudo-state.
MISSING = "MISSING"


def read_checkpoint_state(ledger_url: str, pipeline: str, checkpoint_id: int) -> tuple[str, str | None]:
    """``(state, reason)`` of one checkpoint, read-only; blocking (the trigger runs it in a
    worker thread). ``state`` is the ledger's state name, or :data:`MISSING` when the
    ledger holds no such checkpoint; ``reason`` is the abort reason (or why it is missing).

    The one state read of the sensor's poke/pre-defer check and of the trigger.
    """
    from airflow_provider_eo.ledger import CheckpointNotFound

    # create=False (ledger_reader): no schema upgrade, no file creation; reads only.
    try:
        cp = ledger_reader(ledger_url).get(pipeline, checkpoint_id)
    except CheckpointNotFound as exc:
        return MISSING, str(exc)
    return cp.state.value, cp.abort_reason


def read_launch_failure(ledger_url: str, pipeline: str, checkpoint_id: int, launch_id: str) -> str | None:
    """The error a detached prepare's launcher recorded for launch ``launch_id`` of the
    checkpoint (:data:`~airflow_provider_eo.ledger.events.PREPARE_LAUNCH_FAILED`), None while
    there is none; blocking, read-only."""
    from airflow_provider_eo.ledger import CheckpointNotFound
    from airflow_provider_eo.ledger.events import PREPARE_LAUNCH_FAILED

    try:
        events = ledger_reader(ledger_url).events(pipeline, checkpoint_id)
    except CheckpointNotFound:
        return None
    for event in events:
        details = dict(event.details or {})
        if event.kind == PREPARE_LAUNCH_FAILED and details.get("launch_id") == launch_id:
            where = f" (its log on {details.get('host')}: {details.get('log_path')})"
            return f"the prepare job ended without the checkpoint PREPARED{where}: {details.get('error')}"
    return None


class EoCheckpointTrigger(BaseTrigger):
    """Poll the ledger, read-only, until one checkpoint is PREPARED (or COMMITTED); with
    ``wait_for="committed"``, until it is COMMITTED.

    It never writes: a trigger may run more than once (triggerer restarts, HA), so it
    only reads the checkpoint's state with ``asyncio.to_thread`` (the ledger client is
    synchronous) and yields exactly one event:

    - ``{"status": "success", "pipeline", "checkpoint_id", "state"}`` when PREPARED or
      COMMITTED (``wait_for="committed"``: COMMITTED);
    - ``{"status": "failed", "pipeline", "checkpoint_id", "state", "reason"}`` when
      ABORTED, when the checkpoint does not exist, or (``launch_id``) when the detached
      prepare of that launch ended without the checkpoint PREPARED;
    - ``{"status": "timeout", "pipeline", "checkpoint_id", "state", "reason"}`` when
      ``deadline`` passed first.

    A ledger that cannot be reached is logged and polled again until the deadline.

    :param pipeline: pipeline name (as recorded in the ledger).
    :param checkpoint_id: the checkpoint to wait for.
    :param ledger_url: SQLAlchemy URL of the ledger, without a password.
    :param ledger_conn_id: or the Airflow connection of the ledger (looked up in the
        triggerer): exactly one of the two; a password travels only this way.
    :param poll_interval: seconds between reads.
    :param deadline: UNIX time after which a ``timeout`` event is sent; ``None`` waits forever.
    :param wait_for: ``"prepared"`` (default) or ``"committed"``.
    :param echo: a small JSON object every event carries back as ``"echo"``: what the deferring
        task needs when it resumes (``dag.test()`` hands a resumed task the event alone, not
        the ``kwargs`` it deferred with).
    :param launch_id: the id of a detached prepare of this checkpoint
        (:func:`airflow_provider_eo.detach.launch_detached`): its launcher's failure event
        ends the wait at once with ``failed``.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        wait_for: str = "prepared",
        echo: dict[str, Any] | None = None,
        launch_id: str | None = None,
    ) -> None:
        super().__init__()
        check_ledger_ref(ledger_url, ledger_conn_id, where=f"pipeline {pipeline!r}")
        self.pipeline = pipeline
        self.launch_id = launch_id
        self.checkpoint_id = int(checkpoint_id)
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None
        self.done = done_states(wait_for)
        self.wait_for = wait_for
        self.echo = echo

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "checkpoint_id": self.checkpoint_id,
                "ledger_url": self.ledger_url,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "wait_for": self.wait_for,
                "echo": self.echo,
                "launch_id": self.launch_id,
            },
        )

    def _event(self, status: str, state: str, reason: str | None = None) -> TriggerEvent:
        payload: dict[str, Any] = {
            "status": status,
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id,
            "state": state,
        }
        if reason is not None:
            payload["reason"] = reason
        if self.echo is not None:
            payload["echo"] = self.echo
        return TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        where = f"pipeline {self.pipeline!r}, checkpoint {self.checkpoint_id}"
        state = "UNKNOWN"
        url = await asyncio.to_thread(resolve_ledger_url, self.ledger_url, self.ledger_conn_id)
        while True:
            try:
                state, reason = await asyncio.to_thread(
                    read_checkpoint_state, url, self.pipeline, self.checkpoint_id
                )
                failure = (
                    await asyncio.to_thread(
                        read_launch_failure, url, self.pipeline, self.checkpoint_id, self.launch_id
                    )
                    if self.launch_id is not None and state == "PLANNED"
                    else None
                )
            except LedgerError as exc:  # unreachable database: keep polling until the deadline
                self.log.warning("%s: cannot read the ledger (%s); polling again", where, exc)
            else:
                if state in self.done:
                    yield self._event("success", state)
                    return
                if state == "ABORTED":
                    yield self._event("failed", state, reason or f"{where} was ABORTED")
                    return
                if state == MISSING:
                    yield self._event("failed", state, reason or f"{where} is not in the ledger")
                    return
                if failure is not None:
                    yield self._event("failed", state, f"{where}: {failure}")
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                yield self._event(
                    "timeout",
                    state,
                    f"{where} still {state} at the deadline; is the "
                    f"{'prepare job' if state == 'PLANNED' else 'committer'} running?",
                )
                return
            self.log.info("%s is %s; checking again in %.1fs", where, state, self.poll_interval)
            await asyncio.sleep(self.poll_interval)


class EoCommittedAfterTrigger(BaseTrigger):
    """Poll the ledger, read-only, until a checkpoint of the pipeline was committed after
    ``committed_after`` (streaming mode: "the output is at least this fresh").

    Yields exactly one event:

    - ``{"status": "success", "pipeline", "checkpoint_id", "committed_at",
      "committed_after"}``: the newest COMMITTED checkpoint, committed after the time;
    - ``{"status": "timeout", "pipeline", "committed_after", "reason"}`` when ``deadline``
      passed first.

    A ledger that cannot be reached (or does not know the pipeline yet) is polled again.

    :param pipeline: pipeline name (as recorded in the ledger).
    :param committed_after: ISO-8601 time (naive means UTC).
    :param ledger_url: SQLAlchemy URL of the ledger, without a password.
    :param ledger_conn_id: or the Airflow connection of the ledger (exactly one of the two).
    :param poll_interval: seconds between reads.
    :param deadline: UNIX time after which a ``timeout`` event is sent; ``None`` waits forever.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        committed_after: str,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        check_ledger_ref(ledger_url, ledger_conn_id, where=f"pipeline {pipeline!r}")
        self.pipeline = pipeline
        self.committed_after = as_utc(committed_after).isoformat()
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "committed_after": self.committed_after,
                "ledger_url": self.ledger_url,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        after = as_utc(self.committed_after)
        where = f"pipeline {self.pipeline!r}"
        base = {"pipeline": self.pipeline, "committed_after": self.committed_after}
        url = await asyncio.to_thread(resolve_ledger_url, self.ledger_url, self.ledger_conn_id)
        while True:
            try:
                found = await asyncio.to_thread(read_committed_after, url, self.pipeline, after)
            except LedgerError as exc:
                self.log.warning("%s: cannot read the ledger (%s); polling again", where, exc)
            else:
                if found is not None:
                    cid, committed_at = found
                    yield TriggerEvent(
                        {**base, "status": "success", "checkpoint_id": cid, "committed_at": committed_at}
                    )
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent(
                    {
                        **base,
                        "status": "timeout",
                        "reason": f"{where}: no checkpoint committed after {self.committed_after} "
                        "by the deadline; is the stream (or its commit DAG) running?",
                    }
                )
                return
            self.log.info("%s: nothing committed after %s yet", where, self.committed_after)
            await asyncio.sleep(self.poll_interval)
