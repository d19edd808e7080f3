"""Errors of the local stack (defined in :mod:`airflow_provider_eo.errors`, the one error tree)."""

from __future__ import annotations

from airflow_provider_eo.errors import StackError as StackError
