"""Start a Spark driver that outlives the Airflow task: a streaming application
(``EoStreamOperator(deferrable=True)``, ``EoQueryOperator(deferrable=True)``) or one
checkpoint's prepare (``EoBackfillOperator(deferrable=True)``).

The task builds the Spark provider's :class:`SparkSubmitHook` as usual (its connection is
resolved in the task, where Airflow's secrets are reachable) and hands it, pickled into a
private folder, to a *launcher*: ``python -m airflow_provider_eo.detach``, started
in a new session (so nothing that stops the task's process group stops it) with its output
in the run's log file. The launcher calls the hook's public ``submit()`` and waits for
spark-submit. When spark-submit exits, the launcher settles the run's row in the ledger:

- the application ended its row itself (ENDED/FAILED): nothing to do;
- the row is still RUNNING: the driver died without ending it (SIGKILL, OOM) — FAILED now,
  so the triggerer learns it at once instead of after the heartbeat goes stale;
- no row: spark-submit failed before the application started (bad conf, missing jar,
  no resources) — a FAILED row with spark-submit's error, so the task fails with it.

The task meanwhile defers to :class:`~airflow_provider_eo.triggers.stream.EoStreamRunTrigger`.

A prepare (``prepare_checkpoint``) has no run row: when spark-submit exits and the checkpoint
is not PREPARED, the launcher appends a
:data:`~airflow_provider_eo.ledger.events.PREPARE_LAUNCH_FAILED` event to that checkpoint with
spark-submit's error and the launch's id, and the task's
:class:`~airflow_provider_eo.triggers.checkpoint.EoCheckpointTrigger` (``launch_id``) fails
on it at once instead of waiting for its deadline.
The hook and the ledger URL reach the launcher in a file only its user reads, removed as it
reads it (never on a command line or in the environment).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

LAUNCHER_MODULE = "airflow_provider_eo.detach"
# Airflow 3's task runner blocks the metadata database for task code by setting these to a
# URL nothing can parse ("airflow-db-not-allowed:///"); a child that imports Airflow (the
# launcher unpickling the hook) would fail on import. The launcher never uses the metadata
# database: it gets an in-memory SQLite URL instead (nothing is connected at import).
_BLOCKED_DB_VARS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")


def launch_detached(
    hook: Any,
    application: str,
    *,
    pipeline: str,
    run_id: str,
    ledger_url: str,
    log_path: Path,
    prepare_checkpoint: int | None = None,
) -> int:
    """Start the launcher for ``hook.submit(application)`` in a new session, its output
    appended to ``log_path``; returns the launcher's pid. Does not wait.

    :param run_id: the stream run's id; for a prepare, the launch's id (in its failure event).
    :param prepare_checkpoint: the application is the prepare of this checkpoint of
        ``pipeline`` (settled by :func:`settle_prepare`, not as a stream run)."""
    spec_dir = Path(tempfile.mkdtemp(prefix="eo-stream-launch-"))  # mode 0700
    spec = spec_dir / "hook.pickle"
    with open(spec, "wb") as f:
        # The hook carries the resolved Spark connection and the ledger URL may carry a
        # password: a file only this user reads, never the launcher's environment.
        os.chmod(spec, 0o600)
        pickle.dump({"hook": hook, "ledger_url": ledger_url, "prepare_checkpoint": prepare_checkpoint}, f)
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = dict(os.environ)
    for name in _BLOCKED_DB_VARS:
        if name in env:
            env[name] = "sqlite://"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", LAUNCHER_MODULE, str(spec), application, pipeline, run_id, str(log_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    return proc.pid


def settle_run(ledger_url: str, pipeline: str, run_id: str, *, failure: str | None, log_path: str) -> str:
    """After spark-submit exited: end the run's row if the application did not (see the module
    docstring). Returns what was done, for the log."""
    from airflow_provider_eo.ledger import CheckpointNotFound, Ledger
    from airflow_provider_eo.ledger.streams import (
        FAILED,
        RUNNING,
        StreamRunConflict,
        StreamRunNotFound,
    )

    why = failure or "spark-submit exited 0 but the application did not end its run"
    with Ledger(ledger_url) as ledger:
        try:
            run = ledger.get_stream_run(run_id)
        except StreamRunNotFound:
            try:  # the task registered the pipeline before it launched
                ledger.register_stream_run(
                    pipeline,
                    run_id=run_id,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    commit_mode="?",
                    heartbeat_s=5.0,
                    log_path=log_path,
                )
            except (StreamRunConflict, CheckpointNotFound) as exc:
                return f"not recorded: {exc}"
            ledger.end_stream_run(
                run_id,
                state=FAILED,
                reason=f"the streaming application never started: {why}",
                error=why,
            )
            return "recorded: never started"
        if run.state != RUNNING:
            return f"the application ended its run itself ({run.state})"
        ledger.end_stream_run(
            run_id,
            state=FAILED,
            reason=f"the driver exited without ending its run (killed: a signal or the OOM killer?): {why}",
            error=why,
        )
        return "recorded: died without ending its run"


def settle_prepare(
    ledger_url: str, pipeline: str, checkpoint_id: int, launch_id: str, *, failure: str | None, log_path: str
) -> str:
    """After a detached prepare's spark-submit exited: when the checkpoint is not PREPARED (or
    COMMITTED), record a :data:`~airflow_provider_eo.ledger.events.PREPARE_LAUNCH_FAILED`
    event naming ``launch_id`` and the error, which the waiting trigger reads.
    Returns what was done, for the log."""
    from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState, Ledger
    from airflow_provider_eo.ledger.events import PREPARE_LAUNCH_FAILED

    with Ledger(ledger_url, create=False) as ledger:
        try:
            state = ledger.get(pipeline, checkpoint_id).state
        except CheckpointNotFound as exc:
            return f"not recorded: {exc}"
        if state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            return f"checkpoint {checkpoint_id} is {state.value}"
        why = failure or f"spark-submit exited 0 but checkpoint {checkpoint_id} is {state.value}"
        ledger.record_event(
            pipeline,
            checkpoint_id,
            PREPARE_LAUNCH_FAILED,
            details={
                "launch_id": launch_id,
                "error": why[-3000:],
                "host": socket.gethostname(),
                "log_path": log_path,
            },
        )
        return f"recorded: checkpoint {checkpoint_id} is {state.value} ({why[:200]})"


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_provider_eo.detach SPEC APPLICATION PIPELINE RUN_ID LOG``."""
    spec, application, pipeline, run_id, log_path = (argv or sys.argv[1:])[:5]
    failure: str | None = None
    ledger_url = ""
    prepare_checkpoint: int | None = None
    try:
        try:
            with open(spec, "rb") as f:
                launch = pickle.load(f)  # written by this package's task, mode 0600
        finally:
            Path(spec).unlink(missing_ok=True)
            Path(spec).parent.rmdir()
        ledger_url = str(launch.get("ledger_url") or "")
        prepare_checkpoint = launch.get("prepare_checkpoint")
        launch["hook"].submit(application)
    except Exception as exc:  # spark-submit failed (its tail is in the message), or the hook
        failure = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    if ledger_url and prepare_checkpoint is not None:
        done = settle_prepare(
            ledger_url, pipeline, int(prepare_checkpoint), run_id, failure=failure, log_path=log_path
        )
        print(f"eo: {done}", flush=True)
    elif ledger_url:
        print(
            f"eo: {settle_run(ledger_url, pipeline, run_id, failure=failure, log_path=log_path)}", flush=True
        )
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
