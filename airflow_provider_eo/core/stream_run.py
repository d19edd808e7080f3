"""A stream's run in the ledger: its RUNNING row registered before planning, its heartbeat on
the database's clock, and the stop requests the heartbeat reads."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from airflow_provider_eo.ledger import Actor, Ledger, StreamRunRecord
from airflow_provider_eo.processes import pid_alive

# One logger name for every step of a stream.
log = logging.getLogger("airflow_provider_eo.core.stream")


def new_run_id() -> str:
    """A fresh stream run id: sortable by start time, unique."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"


def register_run(
    ledger: Ledger,
    pipeline: str,
    *,
    run_id: str,
    commit: str,
    heartbeat_s: float,
    actor: Actor | None = None,
    log_path: str | None = None,
) -> StreamRunRecord:
    """Register this process's run; a RUNNING run of this host whose process is gone is
    declared LOST on the way (a restart after SIGKILL need not wait for its heartbeat to
    go stale)."""
    from airflow_provider_eo.ledger.streams import StreamRunConflict

    host = socket.gethostname()
    kwargs: dict[str, Any] = {
        "run_id": run_id,
        "host": host,
        "pid": os.getpid(),
        "commit_mode": commit,
        "heartbeat_s": heartbeat_s,
        "dag_id": actor.dag_id if actor else None,
        "task_id": actor.task_id if actor else None,
        "log_path": log_path,
        "actor": actor,
    }
    try:
        return ledger.register_stream_run(pipeline, **kwargs)
    except StreamRunConflict as exc:
        other = exc.other
        if other.host != host or pid_alive(other.pid):
            raise
        log.warning(
            "pipeline %s: stream run %s (pid %d on this host) is gone; declaring it LOST",
            pipeline,
            other.run_id,
            other.pid,
        )
        return ledger.register_stream_run(pipeline, dead=[other.run_id], **kwargs)


class RunHeartbeat(threading.Thread):
    """Beats the run's row every ``interval_s``; a stop request (or a superseded row) sets
    ``stop``. A ledger that does not answer is logged and tried again next beat: the plan
    needs the ledger anyway and fails loudly there."""

    def __init__(self, ledger: Ledger, run_id: str, interval_s: float, stop: threading.Event) -> None:
        super().__init__(name="eo-stream-heartbeat", daemon=True)
        self.ledger = ledger
        self.run_id = run_id
        self.interval_s = interval_s
        self.stop = stop
        self.halt = threading.Event()
        self.stop_requested_by: str | None = None
        self.superseded: str | None = None

    def finish(self) -> None:
        """Stop beating, and wait for a beat in progress (it must not land after the end)."""
        self.halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def run(self) -> None:
        from airflow_provider_eo.ledger.streams import StreamRunSuperseded

        while not self.halt.wait(self.interval_s):
            try:
                run = self.ledger.heartbeat_stream_run(self.run_id)
            except StreamRunSuperseded as exc:
                log.error("%s", exc)
                self.superseded = str(exc)
                self.stop.set()
                return
            except Exception as exc:  # the ledger did not answer: try again next beat
                log.warning("stream run %s: heartbeat failed: %s", self.run_id, exc)
                continue
            if run.stop_requested_at is not None and not self.stop.is_set():
                log.warning(
                    "stream run %s: stop requested by %s; stopping after the in-flight checkpoints",
                    self.run_id,
                    run.stop_requested_by,
                )
                self.stop_requested_by = run.stop_requested_by or "?"
                self.stop.set()
