"""Fixtures for the exactly-once protocol tests (the harness lives in tests/eo_harness.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import Harness

from airflow_provider_eo.pipeline import Pipeline


@pytest.fixture()
def harness(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], spark: Any
) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def _make(
        *,
        source_partitions: int = 3,
        sink_partitions: int = 3,
        transform: str = "eo_test_transforms:identity",
        sink_config: dict[str, str] | None = None,
        **kw: Any,
    ) -> Harness:
        source = make_topic("src", partitions=source_partitions)
        sink = make_topic("sink", partitions=sink_partitions, **(sink_config or {}))
        pipeline = Pipeline(
            name=f"p-{uuid.uuid4().hex[:8]}",
            kafka=dict(kafka_config),
            source_topics=[source],
            sink_topic=sink,
            transform=transform,
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=str(tmp_path / "staging"),
            **kw,
        )
        h = Harness(pipeline, dict(kafka_config), spark)
        made.append(h)
        return h

    yield _make
    for h in made:
        h.ledger.close()
