from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_eo.ledger import Ledger


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
