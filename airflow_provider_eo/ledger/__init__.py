"""The checkpoint ledger: SQL record of every checkpoint, its offsets, and its transitions."""

from __future__ import annotations

from airflow_provider_eo.ledger.engine import make_engine
from airflow_provider_eo.ledger.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CommitLeaseHeld,
    InvalidTransition,
    InvariantViolation,
    LedgerError,
    LedgerUnavailable,
    PipelineFingerprintMismatch,
    SavepointNotFound,
)
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    CommitPlan,
    EventRecord,
    PipelineRecord,
    RangeSpec,
    SavepointRecord,
    ShardRecord,
    StreamRunRecord,
    TopicPartition,
)
from airflow_provider_eo.ledger.states import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    CheckpointState,
    ShardState,
    can_transition,
    check_transition,
)
from airflow_provider_eo.ledger.store import Ledger
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL, default_ledger_url, redact_url

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DEFAULT_LEDGER_URL",
    "TERMINAL_STATES",
    "UNFINISHED_STATES",
    "Actor",
    "CheckpointConflict",
    "CheckpointNotFound",
    "CheckpointRecord",
    "CheckpointState",
    "CommitLeaseHeld",
    "CommitPlan",
    "EventRecord",
    "InvalidTransition",
    "InvariantViolation",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "PipelineFingerprintMismatch",
    "PipelineRecord",
    "RangeSpec",
    "SavepointNotFound",
    "SavepointRecord",
    "ShardRecord",
    "ShardState",
    "StreamRunRecord",
    "TopicPartition",
    "can_transition",
    "check_transition",
    "default_ledger_url",
    "make_engine",
    "redact_url",
]
