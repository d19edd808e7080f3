"""Errors of the local stack."""

from __future__ import annotations


class StackError(RuntimeError):
    """The local stack could not be fetched, started or stopped; the message says what to do."""
