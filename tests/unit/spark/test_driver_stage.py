"""Driver-side staging's pure parts: when it applies, the files it writes (layout, order,
columns), the positions it counts, and its fallback when the rows are too large to collect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_eo import staging
from airflow_provider_eo.spark import driver_stage


@pytest.mark.parametrize(
    ("bound", "min_records", "expected"),
    [(9, 10, True), (10, 10, False), (None, 10, True), (None, 0, False), (0, 0, False)],
)
def test_driver_stages_below_the_commit_threshold(
    bound: int | None, min_records: int, expected: bool
) -> None:
    assert driver_stage.driver_stages(bound, min_records) is expected


def _table() -> pa.Table:
    rows = [
        # sink_partition, src_topic, src_partition, src_offset, seq
        (1, "t", 0, 7, 10),
        (0, "t", 1, 3, 11),
        (0, None, None, None, 12),  # made by the transform: no source position
        (0, "t", 0, 9, 13),
        (0, "t", 0, 9, 5),  # a second output of the same source record, made first
        (2, "t", 0, 1, 1),
    ]
    return pa.table(
        {
            "key": pa.array([None, b"k", None, b"k", b"k", None], pa.binary()),
            "value": pa.array([b"v%d" % i for i in range(len(rows))], pa.binary()),
            "headers": pa.array(
                [[{"key": "h", "value": b"1"}]] * len(rows),
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            "src_topic": pa.array([r[1] for r in rows], pa.string()),
            "src_partition": pa.array([r[2] for r in rows], pa.int32()),
            "src_offset": pa.array([r[3] for r in rows], pa.int64()),
            "seq": pa.array([r[4] for r in rows], pa.int64()),
            "sink_partition": pa.array([r[0] for r in rows], pa.int32()),
            "size": pa.array([210] * len(rows), pa.int64()),
        }
    )


def test_write_staged_lays_out_sorted_files_per_sink_partition(tmp_path: Path) -> None:
    attempt = str(tmp_path / "attempt-x")
    written = driver_stage.write_staged(_table(), f"{attempt}/data")
    assert written == {0: 4, 1: 1, 2: 1}

    files = staging.describe_attempt(attempt)
    assert {p: [(f.path, f.records) for f in fs] for p, fs in files.items()} == {
        p: [(f"data/sink_partition={p}/{driver_stage.STAGED_FILE}", n)] for p, n in written.items()
    }
    table = pq.read_table(str(tmp_path / "attempt-x" / files[0][0].path))
    assert "sink_partition" not in table.column_names
    # Spark's ascending order: no source position first, then topic, partition, offset, seq.
    order = [(r["src_partition"], r["src_offset"], r["seq"]) for r in table.to_pylist()]
    assert order == [(None, None, 12), (0, 9, 5), (0, 9, 13), (1, 3, 11)]
    assert staging.source_positions(attempt, files) == driver_stage.source_positions(_table()) == 4


def test_write_staged_of_nothing_writes_nothing(tmp_path: Path) -> None:
    assert driver_stage.write_staged(_table().slice(0, 0), str(tmp_path / "a" / "data")) == {}
    assert staging.describe_attempt(str(tmp_path / "a")) == {}
    # The attempt folder exists, as after a Spark write of nothing: the manifest goes there.
    staging.write_manifest(str(tmp_path / "a"), _empty_manifest())
    assert staging.read_manifest(str(tmp_path / "a")).records == 0


def _empty_manifest() -> staging.Manifest:
    return staging.Manifest(
        pipeline="p",
        checkpoint_id=1,
        attempt="a",
        sink_topic="s",
        sink_partitions=3,
        files={},
        records_read=0,
        ranges=[],
    )


class _Frame:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def toArrow(self) -> Any:
        raise self.error


def test_collect_falls_back_only_when_the_rows_are_too_large() -> None:
    too_large = RuntimeError(
        "Job aborted: Total size of serialized results of 3 tasks (1100.0 MiB) is bigger than "
        "spark.driver.maxResultSize (1024.0 MiB)"
    )
    assert driver_stage.collect_staged(_Frame(too_large)) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot parse"):
        driver_stage.collect_staged(_Frame(ValueError("cannot parse record")))  # type: ignore[arg-type]
