"""Streaming mode (docs/design.md §8): one long-running Spark application that turns its
micro-batches into ledger checkpoints, with the same exactly-once protocol.

Every ``interval_s`` the driver plans the next checkpoint (the ledger is the only offset
store: each plan starts where the newest planned checkpoint ends), prepares it on the one
SparkSession, and hands it on:

- ``commit="inline"``: a committer thread of the same process commits prepared checkpoints
  in id order (Flink's ``notifyCheckpointComplete`` in the same job) while the driver plans
  and prepares the next one, so sustained throughput is bounded by the slower phase, not by
  the sum of both;
- ``commit="airflow"``: nothing is committed here; PREPARED checkpoints are left to the
  Airflow commit operator (started by a sensor or asset watcher of the ledger).

Back-pressure: never more than the pipeline's ``max_pending`` unfinished checkpoints; when
that many are PLANNED or PREPARED, the driver waits instead of planning.

Catch-up: a plan cut by ``max_records_per_checkpoint``, or by the size whose commit fits the
transaction timeout (core/plan.py), means input is waiting, so the next plan does not wait
for the interval (only for ``max_pending``): a backlog is carried as fast as prepare and
commit go, not one capped checkpoint per interval.

Start, stop and crash (the numbered cases are what a restart can find):

1. On start, the unfinished checkpoints a previous run left are resumed in id order before
   anything new is planned: a PLANNED one is prepared again (a new attempt folder; a folder
   without a manifest is never published), a PREPARED one is committed (inline) or left to
   Airflow. Commit is idempotent per shard marker, so a commit a SIGKILL cut short
   publishes only what is missing.
2. SIGTERM / SIGINT (and ``--duration``, ``--checkpoints``): planning stops; the checkpoint
   being prepared finishes its prepare; every prepared checkpoint is committed (inline);
   the process then exits 0 with nothing unfinished (inline) or only PREPARED checkpoints
   (airflow). A second signal exits at once, as a SIGKILL would: a restart resumes.
3. SIGKILL at any moment: whatever was PLANNED or PREPARED stays so in the ledger and is
   resumed by case 1; nothing is in a state a restart cannot carry on from.
4. A stopped pipeline (``eo stop``, a stop-with-savepoint) makes the plan raise
   :class:`PipelineStopped`: planning ends, in-flight checkpoints finish as in case 2, and
   the stream ends cleanly (reason ``stopped``).
5. A failed commit stops planning and re-raises its error once the driver is idle; the
   checkpoint stays PREPARED for the next start (or ``eo commit``).

The run in the ledger (:func:`run_stream`): before planning, the stream registers a RUNNING
row (``eo_stream_runs``: host, pid, commit mode) and then beats every ``heartbeat_s``
seconds on the database's clock. A second stream of the same pipeline is refused while the
first one's heartbeat is fresh (:class:`~airflow_provider_eo.ledger.streams.StreamRunConflict`);
a run whose process is gone (same host, no such pid) or that missed ``STALE_FACTOR``
heartbeats is declared LOST, so a restart after SIGKILL is never blocked. A stop request
on the row (``eo stream-stop``, an Airflow task marked failed while it waits) ends the
stream as SIGTERM does; a run whose row was declared LOST and replaced stops at once. On
exit the row is ENDED (with the summary) or FAILED (with the error and traceback): how
``EoStreamOperator(deferrable=True)`` tracks a detached driver from the triggerer.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.core.metrics import MetricsSink
from airflow_provider_eo.core.prepare import Stager
from airflow_provider_eo.core.shard import ShardRunner
from airflow_provider_eo.core.stream_contract import DEFAULT_HEARTBEAT_S, CommitMode, check_stream_settings
from airflow_provider_eo.core.stream_run import RunHeartbeat, new_run_id, register_run
from airflow_provider_eo.core.stream_steps import (
    StreamCheckpoint,
    StreamResult,
    StreamSteps,
    default_steps,
    planned_records,
    unfinished_checkpoints,
)
from airflow_provider_eo.errors import EoError, PipelineStopped
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

_UNFINISHED = frozenset({CheckpointState.PLANNED, CheckpointState.PREPARED})

log = logging.getLogger(__name__)

# The names of the stream's other modules stay importable from here.
__all__ = [
    "RunHeartbeat",
    "StreamCheckpoint",
    "StreamResult",
    "StreamSteps",
    "default_steps",
    "drive_stream",
    "new_run_id",
    "planned_records",
    "register_run",
    "run_stream",
    "stop_on_signals",
    "unfinished_checkpoints",
]


class _Committer(threading.Thread):
    """Commits prepared checkpoints in id order, one at a time, off the driver's thread."""

    def __init__(self, steps: StreamSteps, done: Callable[[StreamCheckpoint], None]) -> None:
        super().__init__(name="eo-stream-committer", daemon=True)
        self.steps = steps
        self.done = done
        self.todo: queue.Queue[StreamCheckpoint | None] = queue.Queue()
        self.error: BaseException | None = None
        self.failed = threading.Event()

    def run(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            if self.error is not None:
                continue  # after a failure nothing later may commit (checkpoints commit in order)
            try:
                seconds = self.steps.commit(item.checkpoint_id)
            except BaseException as exc:  # re-raised by the driver once it is idle
                self.error = exc
                self.failed.set()
                continue
            self.done(
                StreamCheckpoint(
                    item.checkpoint_id,
                    item.records,
                    item.prepare_s,
                    seconds,
                    CheckpointState.COMMITTED.value,
                    item.resumed,
                    item.planned_at,
                    time.time(),
                )
            )


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside: SIGTERM/SIGINT set ``stop`` (the stream ends cleanly); a second signal
    gets the default action (dies at once; a restart resumes). Does nothing off the main
    thread (signal handlers can only be installed there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in sigs}

    def handler(signum: int, frame: Any) -> None:
        log.warning("signal %d: stopping after the in-flight checkpoints", signum)
        stop.set()
        for s in sigs:
            signal.signal(s, signal.SIG_DFL)

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def drive_stream(
    steps: StreamSteps,
    *,
    pipeline: str,
    max_pending: int,
    interval_s: float,
    commit: CommitMode = "inline",
    duration_s: float | None = None,
    max_checkpoints: int | None = None,
    stop: threading.Event | None = None,
    on_checkpoint: Callable[[StreamCheckpoint], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StreamResult:
    """The stream's loop over ``steps`` (see the module docstring for every case).

    Ends when ``stop`` is set, after ``duration_s``, after ``max_checkpoints`` checkpoints
    (resumed ones count), when the pipeline is stopped, or when a commit fails (re-raised
    after the driver stopped).
    """
    check_stream_settings(
        interval=interval_s, commit=commit, duration=duration_s, checkpoints=max_checkpoints
    )
    stop = stop or threading.Event()
    started = clock()
    deadline = None if duration_s is None else started + duration_s
    result = StreamResult(pipeline, commit)
    lock = threading.Lock()
    freed = threading.Condition(lock)
    in_flight: set[int] = set()  # PLANNED/PREPARED checkpoints of this run, not finished

    def finished(item: StreamCheckpoint) -> None:
        with freed:
            in_flight.discard(item.checkpoint_id)
            result.checkpoints.append(item)
            freed.notify_all()
        if on_checkpoint is not None:
            on_checkpoint(item)

    committer = _Committer(steps, finished) if commit == "inline" else None
    if committer is not None:
        committer.start()

    def hand_on(item: StreamCheckpoint) -> None:
        """A PREPARED checkpoint: to the committer (inline), else reported and tracked."""
        if committer is not None:
            committer.todo.put(item)
            return
        with freed:
            result.checkpoints.append(item)
        if on_checkpoint is not None:
            on_checkpoint(item)

    def prepare(cp: CheckpointRecord, resumed: bool) -> None:
        planned_at = time.time()
        records, seconds = steps.prepare(cp.checkpoint_id)
        hand_on(
            StreamCheckpoint(
                cp.checkpoint_id,
                records,
                seconds,
                None,
                CheckpointState.PREPARED.value,
                resumed,
                planned_at,
                time.time(),
            )
        )

    def carried() -> int:
        with lock:
            return len(result.checkpoints) + (len(in_flight) if committer is not None else 0)

    def out_of_time() -> bool:
        return deadline is not None and clock() >= deadline

    def should_end() -> str | None:
        if stop.is_set():
            return "signal"
        if committer is not None and committer.failed.is_set():
            return "commit failed"
        if max_checkpoints is not None and carried() >= max_checkpoints:
            return "checkpoints"
        if out_of_time():
            return "duration"
        return None

    def refresh() -> None:
        """Airflow mode: forget checkpoints someone else committed (or aborted)."""
        if committer is not None:
            return
        with lock:
            ids = sorted(in_flight)
        gone = [cid for cid in ids if steps.state(cid) not in _UNFINISHED]
        with lock:
            in_flight.difference_update(gone)

    reason = ""
    try:
        # 1. Resume what a previous run left, in id order, before planning anything new.
        for cp in steps.unfinished():
            if should_end():
                break
            with lock:
                in_flight.add(cp.checkpoint_id)
            if cp.state is CheckpointState.PLANNED:
                resumed = steps.resume_planned(cp)
                if resumed is None:  # on_data_loss='skip' aborted it: replanned below
                    with lock:
                        in_flight.discard(cp.checkpoint_id)
                    continue
                prepare(resumed, True)
            else:
                now = time.time()
                hand_on(
                    StreamCheckpoint(
                        cp.checkpoint_id, cp.records or 0, None, None, cp.state.value, True, now, now
                    )
                )
        # 2. Every interval: plan the next checkpoint (bounded by max_pending), prepare it.
        next_tick = clock()
        while True:
            ended = should_end()
            if ended:
                reason = ended
                break
            wait = next_tick - clock()
            if deadline is not None:
                wait = min(wait, deadline - clock())
            if wait > 0 and stop.wait(wait):
                continue
            if out_of_time():
                continue
            refresh()
            with freed:
                if len(in_flight) >= max_pending:
                    result.backpressure_waits += 1
                    # Inline: plan as soon as the committer frees a slot; airflow: next tick.
                    if committer is not None:
                        freed.wait(timeout=interval_s)
                    else:
                        next_tick = clock() + interval_s
                    continue
            next_tick = clock() + interval_s
            try:
                planned = steps.plan_next()
            except PipelineStopped as exc:
                log.warning("%s", exc)
                reason = "stopped"
                break
            if planned is None:
                result.empty_intervals += 1
                continue
            if steps.full(planned):
                next_tick = clock()  # a backlog: plan the next one at once (max_pending bounds it)
            with lock:
                in_flight.add(planned.checkpoint_id)
            prepare(planned, False)
    finally:
        # 3. Drain: the committer finishes every checkpoint handed to it, then the driver
        #    re-raises a commit failure. A SIGKILL anywhere here is case 3 of the docstring.
        if committer is not None:
            committer.todo.put(None)
            committer.join()
        result.seconds = clock() - started
        result.reason = reason
        with lock:
            result.unfinished = sorted(in_flight)
    if committer is not None and committer.error is not None:
        err = committer.error
        if isinstance(err, EoError):
            raise err
        raise RuntimeError(f"pipeline {pipeline!r}: the stream's committer failed: {err}") from err
    return result


def run_stream(
    pipeline: Pipeline,
    *,
    interval_s: float = 5.0,
    commit: CommitMode = "inline",
    duration_s: float | None = None,
    max_checkpoints: int | None = None,
    ledger: Ledger | None = None,
    stager: Stager,
    actor: Actor | None = None,
    stop: threading.Event | None = None,
    on_checkpoint: Callable[[StreamCheckpoint], None] | None = None,
    run_id: str | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    log_path: str | None = None,
    runner: ShardRunner | None = None,
    metrics: MetricsSink | None = None,
) -> StreamResult:
    """Run ``pipeline`` in streaming mode until stopped (see the module docstring), every
    checkpoint prepared by ``stager`` (one engine, started once the run is registered):
    SIGTERM/SIGINT end it cleanly when called from the main thread.

    The run is registered in the ledger first (``run_id``, a fresh one by default) and
    beats every ``heartbeat_s`` seconds; it ends ENDED with the summary or FAILED with the
    error. :class:`~airflow_provider_eo.ledger.streams.StreamRunConflict` when another run of
    the pipeline is alive. Prepares and commits are reported to ``metrics`` (none: not
    reported).
    """
    from airflow_provider_eo.ledger.streams import ENDED, FAILED

    # Refused before the run is registered: a StreamArgsError promises nothing was written.
    check_stream_settings(
        interval=interval_s,
        commit=commit,
        duration=duration_s,
        checkpoints=max_checkpoints,
        heartbeat=heartbeat_s,
    )
    require_applied(pipeline, where="the stream")
    own = ledger is None
    ledger = ledger or Ledger(pipeline.ledger_url)
    actor = actor or Actor.here()
    stop = stop or threading.Event()
    try:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        run = register_run(
            ledger,
            pipeline.name,
            run_id=run_id or new_run_id(),
            commit=commit,
            heartbeat_s=heartbeat_s,
            actor=actor,
            log_path=log_path,
        )
        heart = RunHeartbeat(ledger, run.run_id, heartbeat_s, stop)
        heart.start()
        try:
            # Started before the handlers: PySpark installs its own SIGINT handler.
            stager.start(pipeline)
            with stop_on_signals(stop):
                result = drive_stream(
                    default_steps(pipeline, ledger, stager, actor, runner, metrics),
                    pipeline=pipeline.name,
                    max_pending=pipeline.max_pending,
                    interval_s=interval_s,
                    commit=commit,
                    duration_s=duration_s,
                    max_checkpoints=max_checkpoints,
                    stop=stop,
                    on_checkpoint=on_checkpoint,
                )
        except BaseException as exc:
            heart.finish()
            error = "".join(traceback.format_exception(exc)[-20:])
            with contextlib.suppress(Exception):  # the original error matters more
                ledger.end_stream_run(
                    run.run_id, state=FAILED, reason=f"{type(exc).__name__}: {exc}", error=error
                )
            raise
        heart.finish()
        result.run_id = run.run_id
        if heart.superseded:
            result.reason = "superseded"
        elif heart.stop_requested_by and result.reason == "signal":
            result.reason = f"stop requested by {heart.stop_requested_by}"
        ledger.end_stream_run(run.run_id, state=ENDED, reason=result.reason, summary=result.summary())
        return result
    finally:
        # The producers the committer kept between checkpoints (core/shard.py): not left
        # to the interpreter's exit.
        from airflow_provider_eo.kafka.publisher import close_producers

        close_producers()
        if own:
            ledger.close()
