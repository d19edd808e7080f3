"""Keyless records land in the same sink partition whichever way Spark runs the prepare.

A record with neither key nor explicit partition gets a sink partition fixed by the input
(its source position, or its content when the transform dropped provenance), never by the
row's position after the transform's shuffle: two prepares of the same planned range, with a
transform that shuffles randomly and different shuffle settings, must stage every record in
the same sink partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.core.plan import plan_checkpoint
from airflow_provider_eo.core.prepare import prepare_checkpoint
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.stager import SparkStager

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 400


def shuffled_randomly(df: Any) -> Any:
    """Keeps provenance; rows leave the shuffle in a random order and task."""
    from pyspark.sql import functions as F

    return df.repartition(5, F.rand())


def shuffled_without_provenance(df: Any) -> Any:
    """Only the value survives (no key, no provenance: the rows pass through mapInPandas,
    which the provenance column cannot cross); random shuffle as above."""
    from pyspark.sql import functions as F

    def same(batches: Any) -> Any:
        yield from batches

    return df.select("value").mapInPandas(same, "value binary").repartition(5, F.rand())


@pytest.fixture()
def shuffle_partitions(spark: Any) -> Iterator[Callable[[str], None]]:
    """Set ``spark.sql.shuffle.partitions`` for one prepare; restored afterwards."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    yield lambda n: spark.conf.set("spark.sql.shuffle.partitions", n)
    spark.conf.set("spark.sql.shuffle.partitions", before)


def _staged(spark: Any, location: str) -> list[Any]:
    return (
        spark.read.parquet(f"{location}/data")
        .select("src_topic", "src_partition", "src_offset", "value", "sink_partition")
        .collect()
    )


@pytest.mark.parametrize(
    ("transform", "identity"),
    [("shuffled_randomly", "position"), ("shuffled_without_provenance", "value")],
)
def test_keyless_sink_partition_is_fixed_by_the_input(
    transform: str,
    identity: str,
    tmp_path: Path,
    spark: Any,
    kafka_config: dict[str, Any],
    make_topic: Callable[..., str],
    shuffle_partitions: Callable[[str], None],
) -> None:
    source = make_topic("src", partitions=3)
    sink = make_topic("sink", partitions=5)
    producer = Producer(kafka_config)
    for i in range(RECORDS):
        producer.produce(source, value=f"v{i}".encode(), partition=i % 3)  # no key
    assert producer.flush(30) == 0

    staged: list[dict[Any, int]] = []
    planned_ranges = []
    for run, shuffles in enumerate(("3", "11")):
        name = f"keyless-{run}-{uuid.uuid4().hex[:6]}"
        pipeline = Pipeline(
            name=name,
            kafka=dict(kafka_config),
            source_topics=[source],
            sink_topic=sink,
            transform=f"{__name__}:{transform}",
            ledger_url=f"sqlite:///{tmp_path / name}.db",
            staging_dir=str(tmp_path / "staging"),
        )
        with Ledger(pipeline.ledger_url) as ledger:
            planned = plan_checkpoint(pipeline, ledger)
            assert planned is not None
            planned_ranges.append(sorted((r.topic, r.partition, r.start, r.end) for r in planned.ranges))
            shuffle_partitions(shuffles)
            result = prepare_checkpoint(pipeline, ledger, planned.checkpoint_id, stager=SparkStager(spark))
            assert result.checkpoint.state is CheckpointState.PREPARED
            rows = _staged(spark, result.checkpoint.staging_location or "")
        if identity == "position":
            assert all(r.src_offset is not None for r in rows)
            staged.append({(r.src_topic, r.src_partition, r.src_offset): r.sink_partition for r in rows})
        else:
            assert all(r.src_offset is None for r in rows)
            staged.append({bytes(r.value): r.sink_partition for r in rows})
        assert len(rows) == RECORDS and len(staged[-1]) == RECORDS

    assert planned_ranges[0] == planned_ranges[1]  # the same input, read twice
    first, second = staged
    moved = {k: (first[k], second[k]) for k in first if first[k] != second[k]}
    assert not moved, (
        f"{len(moved)} of {RECORDS} keyless records changed sink partition: {list(moved.items())[:5]}"
    )
    assert len(set(first.values())) == 5  # spread over every sink partition
