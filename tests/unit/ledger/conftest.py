from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_eo.ledger import CheckpointRecord, Ledger, RangeSpec


@pytest.fixture(scope="session")
def ledger_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger file migrated once; tests copy it instead of migrating again."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    ledger = Ledger(f"sqlite:///{path}")
    ledger.close()
    return path


@pytest.fixture
def make_ledger(ledger_template: Path, tmp_path: Path) -> Iterator[Callable[[], Ledger]]:
    made: list[Ledger] = []
    counter = iter(range(10_000))

    def make() -> Ledger:
        path = tmp_path / f"ledger-{next(counter)}.db"
        shutil.copyfile(ledger_template, path)
        ledger = Ledger(f"sqlite:///{path}", create=False)
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        ledger.close()


@pytest.fixture
def ledger(make_ledger: Callable[[], Ledger]) -> Ledger:
    led = make_ledger()
    led.ensure_pipeline("orders", "fp-1")
    return led


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
