"""Errors of the local stack."""

from __future__ import annotations

from airflow_provider_eo.errors import EoError


class StackError(EoError):
    """The local development stack could not be fetched, started or stopped; the message says
    what to do. It holds no pipeline data: nothing is at risk."""
