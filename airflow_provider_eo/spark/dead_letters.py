"""Dead letters: the source records a checkpoint leaves out of its output, staged for the
pipeline's dead-letter topic (``Pipeline(dead_letter_topic=..., max_dead_letters_per_checkpoint=N)``).

A source record becomes a dead letter when the user's transform fails on it (found by the
poison-record search, then left out of the next write) or when its output is larger than the
sink topic accepts (``max.message.bytes``; the whole source record goes, never a part of its
output). The records are read back from the source and written as Parquet under the attempt's
``dead`` folder with their error; the commit publishes them in the same Kafka transaction as
the output and the consumer-group offsets (core/shard.py). More than the budget fails the
prepare with the error naming the record, as without dead letters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_eo import names
from airflow_provider_eo.errors import TransformError
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.source import reader_options
from airflow_provider_eo.spark.transform import (
    Transform,
    environment_failure,
    fails_on_last_too,
    is_transform_failure,
    locate_poison,
    record_error,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Position = tuple[str, int, int]  # (topic, partition, offset) of a source record

__all__ = ["Position", "admit", "failing_record", "oversize_records", "write_dead_letters"]


def failing_record(
    exc: BaseException,
    *,
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    live: list[RangeSpec],
    exclude: dict[Position, str],
    time_filter: tuple[int, int] | None,
) -> tuple[Position, str] | None:
    """The one source record the failed write ``exc`` is pinned on, with the transform's
    error on it, when dead letters are enabled; None when they are not, when the failure
    is not the transform's (the environment, Kafka, the filesystem), when the search cannot
    pin it on one record, or when the transform fails on the first and the last record alike
    (its code is broken: no record is to blame)."""
    if not pipeline.dead_letters_enabled:
        return None
    if environment_failure(exc) is not None or not is_transform_failure(exc):
        return None
    poison = locate_poison(spark, pipeline, transform, live, exclude=exclude, time_filter=time_filter)
    if poison is None:
        return None
    if not exclude and fails_on_last_too(spark, pipeline, transform, live, poison):
        return None
    return poison, record_error(spark, pipeline, transform, poison)


def oversize_records(written: DataFrame, max_bytes: int) -> dict[Position, str] | None:
    """The source records whose output is over ``max_bytes`` (with the error for each), from
    the staged files; None when one such output record has no source position (the
    transform made it or dropped provenance: there is no source record to send)."""
    from pyspark.sql import functions as F

    rows = (
        written.where(F.col("size") > max_bytes)
        .groupBy("src_topic", "src_partition", "src_offset")
        .agg(F.max("size").alias("size"))
        .collect()
    )
    found: dict[Position, str] = {}
    for row in rows:
        if row["src_offset"] is None:
            return None
        found[(row["src_topic"], int(row["src_partition"]), int(row["src_offset"]))] = (
            f"an output record of {row['size']} bytes exceeds the sink topic's max.message.bytes={max_bytes}"
        )
    return found


def admit(exclude: dict[Position, str], found: dict[Position, str], pipeline: Pipeline, where: str) -> None:
    """Add ``found`` to the checkpoint's dead letters ``exclude``, or raise the
    :class:`TransformError` that names the record past the budget."""
    budget = pipeline.max_dead_letters_per_checkpoint
    for position, error in sorted(found.items()):
        if position in exclude:
            continue
        if len(exclude) >= budget:
            topic, partition, offset = position
            raise TransformError(
                f"{where}: more than max_dead_letters_per_checkpoint={budget} source records "
                f"cannot be published; the next is {topic}[{partition}] offset {offset}: {error}. "
                "Nothing was published; fix the transform (or the records), or raise "
                "max_dead_letters_per_checkpoint, then retry the prepare."
            )
        exclude[position] = error


def write_dead_letters(
    spark: SparkSession, pipeline: Pipeline, exclude: dict[Position, str], path: str, name: str
) -> int:
    """Read the ``exclude`` records back from the source (key, value, headers, timestamp)
    and write them with their error under ``{path}/dead``, in source order; returns the
    records Spark wrote."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    spans: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in exclude:
        spans.setdefault((topic, partition), []).append(offset)
    ranges = [RangeSpec(t, p, min(o), max(o) + 1) for (t, p), o in sorted(spans.items())]
    source = spark.read.format("kafka").options(**reader_options(pipeline, ranges))
    frame = source.option("includeHeaders", "true").load()
    errors: list[Any] = []
    for (topic, partition, offset), error in sorted(exclude.items()):
        errors += [F.lit(f"{topic}:{partition}:{offset}"), F.lit(error)]
    position = F.concat_ws(":", "topic", F.col("partition").cast("string"), F.col("offset").cast("string"))
    error_of = F.create_map(*errors)[position]
    dead = frame.where(error_of.isNotNull()).select(
        "key",
        "value",
        "headers",
        F.col("topic").alias("src_topic"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        F.unix_millis("timestamp").alias("src_timestamp"),
        error_of.alias("error"),
    )
    counted = Observation(f"{name}-dead")
    (
        dead.observe(counted, F.count(F.lit(1)).alias("rows"))
        .repartition(1)
        .sortWithinPartitions("src_topic", "src_partition", "src_offset")
        .write.mode("errorifexists")
        .parquet(f"{path}/{names.DEAD_LETTERS_DIR}")
    )
    return int(counted.get.get("rows") or 0)
