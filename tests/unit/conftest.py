"""Shared unit fixtures: a pipeline module on sys.path (ledger in tmp_path), a fake task context."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from eo_fake_kafka import check_no_unexpected_waits


@pytest.fixture(autouse=True)
def _fake_kafka_never_waits_unexpectedly() -> Iterator[None]:
    """A fake broker's stable offset read that waited on an open transaction fails the test
    unless the test expected it (tests/eo_fake_kafka.py)."""
    yield
    check_no_unexpected_waits()


@pytest.fixture()
def pipeline_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``module:PIPELINE`` of a pipeline whose ledger is a SQLite file in tmp_path."""
    name = f"eo_test_pipeline_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from airflow_provider_eo.pipeline import Pipeline

            PIPELINE = Pipeline(
                name="orders",
                kafka={{"bootstrap.servers": "127.0.0.1:1"}},
                source_topics=["in"],
                sink_topic="out",
                ledger_url="sqlite:///{tmp_path}/ledger.db",
                staging_dir="{tmp_path}/staging",
            )
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:PIPELINE"
    sys.modules.pop(name, None)


@pytest.fixture()
def context() -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="d", run_id="r1", task_id="eo.x", try_number=1)
    return {"ti": ti}
