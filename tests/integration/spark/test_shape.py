"""The staged columns computed per record: sizes with and without headers, and that the
whole shaping projection stays in Spark's generated code (no per-row interpreter)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.errors import PrepareError
from airflow_provider_eo.kafka.partitioner import java_partition
from airflow_provider_eo.spark import shape, source

pytestmark = [pytest.mark.spark]

HEADER = "array<struct<key:string,value:binary>>"


def _frame(spark: Any, rows: list[tuple[Any, ...]], *, headers: bool) -> Any:

    schema = f"key binary, value binary, topic string, partition int, offset long, headers {HEADER}"
    df = spark.createDataFrame(rows, schema)
    df = source.with_provenance(df).drop("partition")
    return df if headers else df.drop("headers")


def _expected(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None) -> int:
    size = len(key or b"") + len(value or b"") + shape.RECORD_OVERHEAD_BYTES
    for k, v in headers or []:
        size += len(k.encode()) + len(v or b"")
    return size


ROWS = [
    (b"k1", b"value", "t", 0, 0, [("h", b"\x00\xff\xfe"), ("\u00e9t\u00e9", "\u00fc".encode())]),
    (None, b"v", "t", 0, 1, [("only-key", None)]),
    (b"key", None, "t", 0, 2, None),
    (b"", "na\u00efve".encode(), "t", 0, 3, []),
]


def test_record_size_counts_bytes_of_key_value_and_every_header(spark: Any) -> None:
    staged = shape.staged_frame(_frame(spark, ROWS, headers=True), 3, "test")
    got = {r["src_offset"]: r["size"] for r in staged.select("src_offset", "size").collect()}
    assert got == {row[4]: _expected(row[0], row[1], row[5]) for row in ROWS}


def test_record_size_without_a_headers_column(spark: Any) -> None:
    staged = shape.staged_frame(_frame(spark, ROWS, headers=False), 3, "test")
    got = {r["src_offset"]: r["size"] for r in staged.select("src_offset", "size").collect()}
    assert got == {row[4]: _expected(row[0], row[1], None) for row in ROWS}


@pytest.mark.parametrize("headers", [True, False])
def test_the_shaping_projection_is_generated_code(spark: Any, headers: bool) -> None:
    """Every projection of the staged frame runs inside a whole-stage-codegen stage: an
    interpreted expression (e.g. a higher-order function over the headers) makes Spark
    evaluate the whole projection row by row, the sink partition too."""
    staged = shape.staged_frame(_frame(spark, ROWS, headers=headers), 3, "test")
    plan = staged._jdf.queryExecution().executedPlan().toString()
    projects = [line for line in plan.splitlines() if "Project [" in line]
    assert projects, plan
    assert all(line.lstrip(" +-:").startswith("*(") for line in projects), plan


def test_columns_built_once_per_form_follow_each_frames_types(spark: Any) -> None:
    """The staged expressions are reused per session and form: a string-valued frame after a
    binary-valued one of the same columns is still cast, with its key hashed like Java."""
    binary = spark.createDataFrame([(b"k", b"v")], "key binary, value binary")
    text = spark.createDataFrame([("k", "v")], "key string, value string")
    for frame in (binary, text, binary):
        staged = shape.staged_frame(frame, 3, "test")
        assert dict(staged.dtypes)["value"] == "binary"
        assert dict(staged.dtypes)["key"] == "binary"
        row = staged.select("key", "value", "sink_partition").first()
        assert (row["key"], row["value"]) == (b"k", b"v")
        assert row["sink_partition"] == java_partition(b"k", 3)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            "value int",
            r"pipeline p, checkpoint 7: output column 'value' has type int; it must be binary or string",
        ),
        ("key array<int>, value string", r"output column 'key' has type array<int>"),
        ("value string, headers array<string>", r"output column 'headers' must be array<struct"),
    ],
)
def test_an_output_column_of_the_wrong_type_is_refused(spark: Any, schema: str, message: str) -> None:
    frame = spark.createDataFrame([], schema)
    with pytest.raises(PrepareError, match=message):
        shape.staged_frame(frame, 3, "pipeline p, checkpoint 7")


def test_an_explicit_partition_wins_over_the_key_and_is_not_staged(spark: Any) -> None:
    """A transform's ``partition`` column picks the sink partition (over the key's hash);
    the staged files carry only ``sink_partition``, and a partition the sink lacks is counted."""
    from pyspark.sql import Observation

    frame = spark.createDataFrame(
        [(b"k", b"v", 2), (b"k", b"w", None), (b"k", b"x", 7)], "key binary, value binary, partition int"
    )
    staged = shape.staged_frame(frame, 3, "test")
    assert staged.columns == [
        "key",
        "value",
        "headers",
        "src_topic",
        "src_partition",
        "src_offset",
        "seq",
        "sink_partition",
        "size",
    ]
    limits = Observation("explicit-partition")
    rows = shape.observe_limits(staged, limits, 1_000_000, 3).select("value", "sink_partition").collect()
    assert {bytes(r["value"]): r["sink_partition"] for r in rows} == {
        b"v": 2,
        b"w": java_partition(b"k", 3),
        b"x": 7,
    }
    assert limits.get["bad_partition"] == 1


def test_the_sources_own_partition_column_is_not_a_sink_partition(spark: Any) -> None:
    """The source's ``partition`` column passed through untouched is where the record was
    read, not a sink partition: the key decides. A ``partition`` the transform computes (or
    re-aliases) is an explicit sink partition."""
    from pyspark.sql import functions as F

    key = next(k for k in (b"k%d" % i for i in range(100)) if java_partition(k, 3) == 0)
    read = spark.createDataFrame(
        [(key, b"v", "t", 2, 0)], "key binary, value binary, topic string, partition int, offset long"
    )
    frame = source.with_provenance(read)

    def sink_partition(out: Any) -> int:
        return shape.staged_frame(out, 3, "test", frame).select("sink_partition").first()[0]

    assert sink_partition(frame) == 0
    assert sink_partition(frame.select("key", "value", "partition", source.PROVENANCE_COLUMN)) == 0
    assert sink_partition(frame.withColumn("partition", F.lit(1))) == 1
    assert sink_partition(frame.withColumn("partition", F.col("partition"))) == 2
