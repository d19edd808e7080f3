"""The checkpoint state machine: states, terminal states and the one table of allowed moves."""

from __future__ import annotations

import enum

from airflow_provider_eo.ledger.errors import InvalidTransition


class CheckpointState(str, enum.Enum):
    """Where one checkpoint is in its life (see docs/design.md §2)."""

    PLANNED = "PLANNED"
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    def __str__(self) -> str:
        return self.value


TERMINAL_STATES: frozenset[CheckpointState] = frozenset({CheckpointState.COMMITTED, CheckpointState.ABORTED})

#: Not terminal: a pipeline may hold at most ``max_pending`` checkpoints in these states.
UNFINISHED_STATES: frozenset[CheckpointState] = frozenset({CheckpointState.PLANNED, CheckpointState.PREPARED})

ALLOWED_TRANSITIONS: frozenset[tuple[CheckpointState, CheckpointState]] = frozenset(
    {
        (CheckpointState.PLANNED, CheckpointState.PREPARED),
        (CheckpointState.PREPARED, CheckpointState.COMMITTED),
        (CheckpointState.PLANNED, CheckpointState.ABORTED),
        (CheckpointState.PREPARED, CheckpointState.ABORTED),
    }
)


class ShardState(str, enum.Enum):
    """Whether one commit shard's Kafka transaction is known to have committed."""

    PENDING = "PENDING"
    COMMITTED = "COMMITTED"

    def __str__(self) -> str:
        return self.value


def can_transition(source: CheckpointState, target: CheckpointState) -> bool:
    """True when ``source -> target`` is in :data:`ALLOWED_TRANSITIONS`."""
    return (source, target) in ALLOWED_TRANSITIONS


def check_transition(
    source: CheckpointState, target: CheckpointState, *, pipeline: str, checkpoint_id: int
) -> None:
    """Raise :class:`InvalidTransition` unless ``source -> target`` is allowed.

    A real check (not an ``assert``): it holds under ``python -O`` too.
    """
    if not can_transition(source, target):
        allowed = sorted(f"{a.value} -> {b.value}" for a, b in ALLOWED_TRANSITIONS)
        raise InvalidTransition(
            f"pipeline '{pipeline}', checkpoint {checkpoint_id}: {source.value} -> {target.value} "
            f"is not an allowed transition (allowed: {', '.join(allowed)}); nothing was changed. "
            "This is a bug in the caller: report it",
            pipeline=pipeline,
            checkpoint_id=checkpoint_id,
            source=source.value,
            target=target.value,
        )
