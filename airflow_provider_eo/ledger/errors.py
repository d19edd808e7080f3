"""The errors the ledger raises (defined in :mod:`airflow_provider_eo.errors`, the one error
tree). Each message says what happened, to what, and what to do next."""

from __future__ import annotations

from airflow_provider_eo.errors import CheckpointConflict as CheckpointConflict
from airflow_provider_eo.errors import CheckpointNotFound as CheckpointNotFound
from airflow_provider_eo.errors import CommitLeaseHeld as CommitLeaseHeld
from airflow_provider_eo.errors import InvalidTransition as InvalidTransition
from airflow_provider_eo.errors import InvariantViolation as InvariantViolation
from airflow_provider_eo.errors import LedgerError as LedgerError
from airflow_provider_eo.errors import LedgerUnavailable as LedgerUnavailable
from airflow_provider_eo.errors import PipelineFingerprintMismatch as PipelineFingerprintMismatch
from airflow_provider_eo.errors import SavepointNotFound as SavepointNotFound
