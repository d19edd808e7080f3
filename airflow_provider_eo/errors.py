"""Errors a user of the pipeline can hit; each names the pipeline/checkpoint and what to do."""

from __future__ import annotations


class EoError(RuntimeError):
    """Base class of the provider's own errors."""


class DataLossError(EoError):
    """Planned offsets were deleted by retention before the pipeline read them."""


class SourceError(EoError):
    """A source topic/partition is missing or its offsets make no sense."""


class PrepareError(EoError):
    """The prepare job refused the checkpoint (bad transform output, oversized record, ...).

    Nothing was published; the checkpoint stays PLANNED and is retryable after the fix.
    """


class TransformError(PrepareError):
    """The user's transform raised; the message names the checkpoint and, when found, the record."""


class StagingError(EoError):
    """Staged output is missing or does not match its manifest: nothing is published from it."""


class CommitError(EoError):
    """A commit could not finish; the message says whether data may be affected."""


class CommitFenced(CommitError):
    """Another producer with the same transactional id took over: this committer must stop."""


class NotPrepared(CommitError):
    """The checkpoint to commit is not PREPARED yet."""
