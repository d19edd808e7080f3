"""The state machine: the one table of allowed moves, and the refusal of any other move."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_eo.ledger import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    CheckpointState,
    InvalidTransition,
    Ledger,
    LedgerError,
    RangeSpec,
    can_transition,
    check_transition,
)

S = CheckpointState
FORBIDDEN = sorted(
    (pair for pair in itertools.product(S, S) if pair not in ALLOWED_TRANSITIONS),
    key=lambda pair: (pair[0].value, pair[1].value),
)


def test_transition_table_is_the_documented_one() -> None:
    assert {(a.value, b.value) for a, b in ALLOWED_TRANSITIONS} == {
        ("PLANNED", "PREPARED"),
        ("PREPARED", "COMMITTED"),
        ("PLANNED", "ABORTED"),
        ("PREPARED", "ABORTED"),
    }
    assert frozenset({S.COMMITTED, S.ABORTED}) == TERMINAL_STATES
    assert frozenset({S.PLANNED, S.PREPARED}) == UNFINISHED_STATES
    assert not any(src in TERMINAL_STATES for src, _ in ALLOWED_TRANSITIONS)


def test_states_store_their_names() -> None:
    # The ledger's rows hold these strings (migration 0001's CHECK constraints list them).
    assert [s.value for s in S] == ["PLANNED", "PREPARED", "COMMITTED", "ABORTED"]
    assert str(S.PREPARED) == f"{S.PREPARED}" == "PREPARED"


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED_TRANSITIONS, key=str))
def test_allowed_moves_pass(source: CheckpointState, target: CheckpointState) -> None:
    assert can_transition(source, target)
    check_transition(source, target, pipeline="orders", checkpoint_id=1)


@pytest.mark.parametrize(("source", "target"), FORBIDDEN)
def test_forbidden_moves_raise(source: CheckpointState, target: CheckpointState) -> None:
    assert not can_transition(source, target)
    with pytest.raises(InvalidTransition) as info:
        check_transition(source, target, pipeline="orders", checkpoint_id=7)
    err = info.value
    assert isinstance(err, LedgerError)
    assert (err.pipeline, err.checkpoint_id, err.source, err.target) == (
        "orders",
        7,
        source.value,
        target.value,
    )
    assert f"{source.value} -> {target.value} is not an allowed transition" in str(err)
    assert "'orders', checkpoint 7" in str(err)


def test_forbidden_move_changes_no_row(ledger: Ledger) -> None:
    """The ledger's one conditional UPDATE refuses a move outside the table before it runs."""
    from airflow_provider_eo.ledger import transitions

    ledger.plan("orders", [RangeSpec("t", 0, 0, 10)])
    with pytest.raises(InvalidTransition, match="PLANNED -> COMMITTED"), ledger._db.write() as s:
        transitions._move(s, "orders", 1, 1, S.PLANNED, S.COMMITTED, {})
    assert ledger.get("orders", 1).state == S.PLANNED


def test_refusal_survives_python_O(tmp_path: Path) -> None:
    """``python -O`` strips asserts: the ledger's refusal must not be one."""
    code = f"""
from airflow_provider_eo.ledger import CheckpointState as S, InvalidTransition, Ledger, RangeSpec, transitions
assert False, "asserts are on"  # -O is in effect only if this line does not fire
ledger = Ledger("sqlite:///{tmp_path / "l.db"}")
ledger.ensure_pipeline("orders", "fp")
ledger.plan("orders", [RangeSpec("t", 0, 0, 10)])
try:
    with ledger._db.write() as s:
        transitions._move(s, "orders", 1, 1, S.PLANNED, S.COMMITTED, {{}})
except InvalidTransition:
    print("refused")
print(ledger.get("orders", 1).state.value)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "PLANNED"]
