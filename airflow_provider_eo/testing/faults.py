"""Test-only fault injection: crash or pause the current process at a named protocol step.

Set ``EO_FAULT=<step>`` (and optionally ``EO_FAULT_ACTION=kill|pause|exit``) in a child
process's environment. Unset, every call is a no-op dictionary lookup. ``EO_FAULT_HIT=<n>``
fires on the n-th time the step is reached (default 1): with several commit shards,
``EO_FAULT_HIT=2`` stops the committer in the second shard, after the first committed.
``EO_FAULT_ONCE=<file>`` fires only in the first process that gets there, across processes
(a Spark task's retry runs in a new Python worker, which would otherwise fire again); the
file is created when it fires.

Two actions for the distributed commit, in a Spark executor's Python worker:
``kill-executor`` SIGKILLs the executor JVM that runs the task (an executor lost mid-shard);
``zombie`` writes this process's pid to ``<EO_FAULT_ONCE>.pid``, ignores the hang-up its
executor's shutdown sends, and stops itself (SIGSTOP) with its transaction open: a task
attempt that outlives its executor or driver until the test continues it (SIGCONT).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

_HITS: dict[str, int] = {}

STEPS = frozenset(
    {
        "prepare.after_write",  # staged files written, manifest not yet
        "prepare.before_ledger",  # manifest written, ledger still PLANNED
        "commit.task_start",  # a spark-mode commit task started, its shard not begun
        "commit.after_begin",  # a transaction is open, some records produced
        "commit.before_commit_txn",  # everything produced, commit_transaction not called
        "commit.before_end_txn",  # marker and group offsets sent, commit_transaction next
        "commit.after_commit_txn",  # Kafka committed, ledger not yet COMMITTED
        "commit.before_ledger",  # every shard committed, ledger update not done
        "commit.ambiguous_before",  # commit_transaction "timed out" without being sent
        "commit.ambiguous_after",  # commit_transaction succeeded but the caller lost the answer
        "batch.before_stage",  # Structured Streaming sink: batch PLANNED, its frame not staged
        "batch.after_commit",  # the batch COMMITTED, foreachBatch not returned (no Spark commit log)
    }
)


def fault_triggered(step: str) -> bool:
    """True once when ``EO_FAULT`` names ``step`` with ``EO_FAULT_ACTION=raise``: the caller
    then simulates that step's failure itself (e.g. an ambiguous commit). Cleared after the
    first hit so the retry path runs normally."""
    if os.environ.get("EO_FAULT") != step or os.environ.get("EO_FAULT_ACTION") != "raise":
        return False
    print(f"eo: injected fault at {step}: raise", file=sys.stderr, flush=True)
    del os.environ["EO_FAULT"]
    return True


def fault_point(step: str) -> None:
    """Crash (SIGKILL), pause (SIGSTOP) or exit(3) here when ``EO_FAULT`` names ``step``."""
    if os.environ.get("EO_FAULT") != step:
        return
    _HITS[step] = _HITS.get(step, 0) + 1
    if _HITS[step] != int(os.environ.get("EO_FAULT_HIT", "1")):
        return
    once = os.environ.get("EO_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    action = os.environ.get("EO_FAULT_ACTION", "kill")
    print(f"eo: injected fault at {step}: {action}", file=sys.stderr, flush=True)
    if action == "kill-executor":
        os.kill(_executor_jvm(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "zombie":
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        try:
            os.setsid()  # out of the worker daemon's process group (it signals the group)
        except OSError:
            pass
        Path(f"{once or '/tmp/eo-zombie'}.pid").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "exit":
        raise SystemExit(3)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def _executor_jvm() -> int:
    """The pid of the nearest ancestor JVM (the Spark executor running this Python worker)."""
    pid = os.getppid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if cmdline and cmdline[0].endswith(b"java"):
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise RuntimeError("injected fault kill-executor: no JVM above this process")
