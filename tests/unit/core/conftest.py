"""Fixtures of the commit, abort and recover unit tests: the pipeline ``orders`` with the
module's ``SHARDS`` commit shards onto its sink topic ``OUT`` (``SINK_PARTITIONS``
partitions on the fake broker), and a real SQLite ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from eo_fake_kafka import FakeBroker, fake_pipeline, patched_broker
from eo_ledgers import LedgerFactory

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline


@pytest.fixture
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Pipeline:
    return fake_pipeline(tmp_path, sink=request.module.OUT, shards=request.module.SHARDS)


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(pipeline="orders")


@pytest.fixture
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    return patched_broker(monkeypatch, {request.module.OUT: request.module.SINK_PARTITIONS})
