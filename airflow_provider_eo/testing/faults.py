"""Test-only fault injection: crash or pause the current process at a named protocol step.

Set ``EO_FAULT=<step>`` (and optionally ``EO_FAULT_ACTION=kill|pause|exit``) in a child
process's environment. Unset, every call is a no-op dictionary lookup. ``EO_FAULT_HIT=<n>``
fires on the n-th time the step is reached (default 1): with several commit shards,
``EO_FAULT_HIT=2`` stops the committer in the second shard, after the first committed.
"""

from __future__ import annotations

import os
import signal
import sys

_HITS: dict[str, int] = {}

STEPS = frozenset(
    {
        "prepare.after_write",  # staged files written, manifest not yet
        "prepare.before_ledger",  # manifest written, ledger still PLANNED
        "commit.after_begin",  # a transaction is open, some records produced
        "commit.before_commit_txn",  # everything produced, commit_transaction not called
        "commit.before_end_txn",  # marker and group offsets sent, commit_transaction next
        "commit.after_commit_txn",  # Kafka committed, ledger not yet COMMITTED
        "commit.before_ledger",  # every shard committed, ledger update not done
        "commit.ambiguous_before",  # commit_transaction "timed out" without being sent
        "commit.ambiguous_after",  # commit_transaction succeeded but the caller lost the answer
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
    action = os.environ.get("EO_FAULT_ACTION", "kill")
    print(f"eo: injected fault at {step}: {action}", file=sys.stderr, flush=True)
    if action == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "exit":
        raise SystemExit(3)
    else:
        os.kill(os.getpid(), signal.SIGKILL)
