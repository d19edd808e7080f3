"""Errors the ledger raises. Each message says what happened, to what, and what to do next."""

from __future__ import annotations

from airflow_provider_eo.errors import EoError


class LedgerError(EoError):
    """The ledger refused or could not record something. Its transitions are atomic: a
    refused one changed nothing, so no data is at risk; the message says what to do."""


class CheckpointConflict(LedgerError):
    """A conditional transition matched no row: someone else moved the checkpoint first."""

    def __init__(
        self,
        message: str,
        *,
        pipeline: str = "",
        checkpoint_id: int | None = None,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.expected = expected
        self.actual = actual


class CheckpointNotFound(LedgerError):
    """No checkpoint (or pipeline, or savepoint) with that id."""


class InvariantViolation(LedgerError):
    """A request would break a ledger invariant (gap, overlap, too many pending, order)."""


class PipelineFingerprintMismatch(LedgerError):
    """The pipeline's settings changed since its checkpoints were recorded."""


class CommitLeaseHeld(LedgerError):
    """Another committer holds an unexpired commit lease on the checkpoint."""

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class LedgerUnavailable(LedgerError):
    """The ledger database cannot be reached; nothing was changed, retry later."""


class SavepointNotFound(CheckpointNotFound):
    """No savepoint with that name for the pipeline."""


class InvalidTransition(LedgerError):
    """A move that is not in the state machine's table of allowed transitions.

    A programming error, not a race: the ledger refuses it before touching the row, so
    nothing changed and no data is at risk.
    """

    def __init__(self, message: str, *, pipeline: str, checkpoint_id: int, source: str, target: str) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.source = source
        self.target = target
