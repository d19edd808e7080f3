from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import CheckpointRecord, Ledger, RangeSpec

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> Ledger:
    """A SQLite ledger (tests/conftest.py's factory) with the pipeline ``orders`` registered."""
    return make_ledger(pipeline="orders", fingerprint="fp-1")


class LedgerSteps:
    """Drive checkpoints of the pipeline ``orders`` through their states in one call."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def prepare(self, cp: int, attempt: str = "a1") -> CheckpointRecord:
        """PLANNED -> PREPARED for ``attempt``, with made-up manifest stats."""
        return self.ledger.mark_prepared(
            "orders",
            cp,
            attempt=attempt,
            staging_location=f"/stage/{cp}/{attempt}",
            records=10,
            bytes_=100,
            shard_counts={0: 6, 1: 4},
        )

    def run_one(self, *ranges: RangeSpec) -> int:
        """Plan, prepare and commit one checkpoint reading ``ranges``; its id."""
        cp = self.ledger.plan("orders", list(ranges)).checkpoint_id
        self.prepare(cp)
        self.ledger.mark_committed("orders", cp)
        return cp


@pytest.fixture
def steps(ledger: Ledger) -> LedgerSteps:
    return LedgerSteps(ledger)
