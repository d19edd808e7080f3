"""A small checkpoint staged from the driver (spark/driver_stage.py) is staged as the executors
stage it: the same records per sink partition in the same order per source partition, the
same manifest counts, the same dead letters; and a PREPARED checkpoint the driver staged is
published exactly once after the process that staged it is SIGKILLed."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo import staging
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.spark.driver_stage import STAGED_FILE

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PER_PARTITION = 40
# (source partition, index) -> value; everything else is b"ok-<p>-<i>".
SPECIAL = {
    (0, 5): b"POISON-a",  # the transform fails on it: a dead letter
    (0, 31): b"BIG-a",  # its output is over the sink's max.message.bytes: a dead letter
    (1, 17): b"POISON-b",
    (0, 2): b"TWICE-a",  # two output records of one source record
    (2, 9): b"TWICE-b",
}


def _files(location: str) -> list[str]:
    return sorted(p.name for p in Path(location, "data").rglob("*.parquet"))


def _rows(location: str, files: list[staging.StagedFile]) -> dict[Any, list[dict[str, Any]]]:
    """A sink partition's staged rows grouped by source partition, each group in staged order
    (rows of different source partitions keep no order between them, as on the executors)."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for batch in staging.iter_batches(location, files):
        for row in batch.to_pylist():
            groups.setdefault((row["src_topic"], row["src_partition"]), []).append(row)
    return groups


def _without_seq(groups: dict[Any, list[dict[str, Any]]]) -> dict[Any, list[dict[str, Any]]]:
    return {g: [{k: v for k, v in row.items() if k != "seq"} for row in rows] for g, rows in groups.items()}


def test_driver_and_executors_stage_the_same(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    h = harness(
        source_partitions=3,
        sink_partitions=4,
        transform="eo_test_transforms:poison_big_twice_headers",
        sink_config={"max.message.bytes": "3000"},
        dead_letter_topic=make_topic("dlq", partitions=2),
        max_dead_letters_per_checkpoint=5,
    )
    producer = Producer(h.config)
    for p in range(3):
        for i in range(PER_PARTITION):
            value = SPECIAL.get((p, i), f"ok-{p}-{i}".encode())
            key = None if i % 3 == 0 else f"k{i % 7}".encode()  # a third keyless
            producer.produce(
                h.pipeline.source_topics[0], key=key, value=value, partition=p, headers=[("h", b"1")]
            )
    assert producer.flush(30) == 0

    manifests = {}
    for path, min_records in (("driver", 1_000_000), ("executors", 0)):
        run = h.with_(name=f"{h.pipeline.name}-{path}", spark_commit_min_records=min_records)
        planned = run.plan()
        result = run.prepare(planned.checkpoint_id)
        assert result.checkpoint.state is CheckpointState.PREPARED
        location = result.checkpoint.staging_location
        names = _files(location)
        assert (STAGED_FILE in names) == (path == "driver"), names
        manifests[path] = (location, staging.read_manifest(location))
        staging.verify(location, manifests[path][1])

    (d_loc, driver), (e_loc, executors) = manifests["driver"], manifests["executors"]
    assert driver.records == 3 * PER_PARTITION - 3 + 2  # 3 dead letters, 2 records doubled
    assert driver.partition_counts() == executors.partition_counts()
    assert (driver.records_read, driver.ranges, driver.dropped, driver.created) == (
        executors.records_read,
        executors.ranges,
        executors.dropped,
        executors.created,
    )
    assert (driver.dead_letter_count, driver.dead_letter_topic) == (3, executors.dead_letter_topic)
    assert executors.dead_letter_count == 3
    assert len(driver.files) == len(executors.files) == 4  # every sink partition has records

    for partition, files in driver.files.items():
        ours, theirs = _rows(d_loc, files), _rows(e_loc, executors.files[partition])
        # The same rows in the same order; ``seq`` (Spark's monotonically_increasing_id, an
        # ordering key only) counts within the read's Spark partitions, which differ
        # between the driver's read (a local relation) and Spark's Kafka source.
        assert _without_seq(ours) == _without_seq(theirs), f"sink partition {partition} differs"
        for rows in ours.values():  # source order within each source partition
            assert [(r["src_offset"], r["seq"]) for r in rows] == sorted(
                (r["src_offset"], r["seq"]) for r in rows
            )
    keyless = [
        r
        for files in driver.files.values()
        for g in _rows(d_loc, files).values()
        for r in g
        if r["key"] is None
    ]
    assert keyless and all(r["headers"] and r["headers"][0]["key"] == "len" for r in keyless)

    # The files hold the same columns and types (no sink_partition: it is the folder's).
    d_schema = pq.read_schema(str(Path(d_loc, driver.files[0][0].path)))
    e_schema = pq.read_schema(str(Path(e_loc, executors.files[0][0].path)))
    assert d_schema.remove_metadata() == e_schema.remove_metadata()
    assert "sink_partition" not in d_schema.names

    dead = [
        sorted(
            (r["src_topic"], r["src_partition"], r["src_offset"], r["value"], r["error"])
            for b in staging.iter_batches(loc, m.dead_letters)
            for r in b.to_pylist()
        )
        for loc, m in ((d_loc, driver), (e_loc, executors))
    ]
    assert dead[0] == dead[1] and len(dead[0]) == 3


def test_driver_staged_checkpoint_is_published_after_a_kill(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=3, sink_partitions=2)
    h.produce(150)
    planned = h.plan()
    # `eo run-once` stages from the driver, moves the checkpoint to PREPARED, then is killed
    # with the commit's transaction open and records sent.
    proc = h.cli("run-once", fault="commit.after_begin")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED
    location = cp.staging_location or ""
    assert STAGED_FILE in _files(location)
    assert staging.read_manifest(location).records == 150

    results = h.drain()
    assert [r.checkpoint.checkpoint_id for r in results][:1] == [planned.checkpoint_id]
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.COMMITTED
    assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=150)
    h.assert_exactly_once(expected_records=150)
