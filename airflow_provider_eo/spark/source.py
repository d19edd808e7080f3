"""Read exactly a checkpoint's planned ranges with Spark's Kafka source.

The read is bounded (``startingOffsets``/``endingOffsets`` per partition), ``read_committed``
and loud about vanished offsets. Per-range counts and min/max record timestamps are observed
during the job that writes the output, so the source is never read twice.

A small checkpoint (at most :data:`DRIVER_READ_MAX_RECORDS` offsets, staged by the driver) may
be read by the driver instead, the same records in the same columns handed to Spark as a local
relation (:func:`driver_source`): a batch read of Kafka creates an admin client and plans
a scan for every query, which cost more than reading a thousand records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.core.prepare import RangeRead
from airflow_provider_eo.kafka.client_config import java_client_options
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.expressions import per_jvm

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_LOG = logging.getLogger(__name__)

#: ``kafka.fetch.max.wait.ms`` of the bounded read unless the pipeline sets
#: ``java.fetch.max.wait.ms``. A planned range always exists in full, so the read never needs
#: the broker to hold a fetch for more data; with the Java client's default (500 ms) every
#: task whose range ends at the partition's log end (every streaming checkpoint that caught
#: up) waited that long once. Measured with ``bench/profile_prepare.py --only read,prepare
#: --fetch-max-wait-ms 500`` and without the flag (500k records, 4 partitions, local[2],
#: medians of 3 warm runs): the read 2.06 s -> 1.17 s, the whole prepare 3.04 s -> 2.21 s.
FETCH_MAX_WAIT_MS = 20

#: The most offsets a checkpoint's ranges may span for the driver to read them itself
#: (:func:`driver_source`). Measured (``bench/profile_prepare.py``-like loop, 4 partitions,
#: local[2], warm, medians of 20): 1,000 records read, planned and collected 181-215 ms with
#: Spark's Kafka source, 69-95 ms read by the driver; 25,000 records 222-308 ms against
#: 236-285 ms; 125,000 records 388-473 ms against 773-792 ms (the driver's consume loop).
DRIVER_READ_MAX_RECORDS = 10_000

#: The py4j gateways (one per driver JVM) whose JVM refused a DataFrame built from Arrow data
#: (:func:`driver_source` then leaves every read to Spark's Kafka source).
_ARROW_REFUSED: set[int] = set()

#: The consumer group id of the driver's reads (:func:`driver_source`), one for every pipeline
#: of a cluster: its consumer is kept between reads, one per client config, whatever the
#: pipeline (never joined, never committed, like the executors' group below).
DRIVER_READER_GROUP = "eo-read.driver"

#: The executors' consumer group id of a pipeline's reads (``kafka.group.id``), the same for
#: every checkpoint. Spark pools its executors' Kafka consumers by group id and partition, and
#: a bounded read otherwise gets a new random group id per query: every checkpoint then
#: created (connected, bootstrapped) a new consumer per task instead of reusing the last
#: one's. The reads assign partitions and never commit, so the group never forms on the broker
#: (no membership, no offsets; eo's offsets live in ``Pipeline.consumer_group``). A/B on 5,000
#: record reads of 4 partitions, local[2], alternating, 20 each, on a machine loaded by other
#: test runs: median 561 -> 488 ms, fastest 342 -> 246 ms.
READER_GROUP_PREFIX = "eo-read."

PROVENANCE_COLUMN = "_eo_src"
"""The struct (topic, partition, offset) of each source record, handed to the transform; a
transform that keeps it lets the prepare keep source order and name offending records."""


def live_ranges(ranges: list[RangeSpec]) -> list[RangeSpec]:
    """The ranges that hold at least one offset (empty ranges are never read)."""
    return [r for r in ranges if r.end > r.start]


def source_options(ranges: list[RangeSpec]) -> dict[str, str]:
    """The Kafka source's ``assign``/``startingOffsets``/``endingOffsets`` JSON for ``ranges``."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in live_ranges(ranges):
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    return {
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
    }


def reader_options(pipeline: Pipeline, ranges: list[RangeSpec]) -> dict[str, str]:
    """Every option of the bounded read of ``ranges``: :data:`FETCH_MAX_WAIT_MS` (unless the
    pipeline sets ``java.fetch.max.wait.ms``), the reader group (:data:`READER_GROUP_PREFIX`,
    unless it sets ``java.group.id``), the pipeline's Java client settings, the ranges,
    ``read_committed`` and ``failOnDataLoss``."""
    return {
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
        "kafka.group.id": READER_GROUP_PREFIX + pipeline.name,
        **java_client_options(pipeline.kafka, owner=f"pipeline {pipeline.name!r}"),
        **source_options(ranges),
        "kafka.isolation.level": "read_committed",  # never aborted/open txn data
        # Offsets that vanished between plan and read are loud, never skipped.
        "failOnDataLoss": "true",
    }


def kafka_source(spark: SparkSession, pipeline: Pipeline, ranges: list[RangeSpec]) -> DataFrame:
    """A bounded DataFrame of exactly ``ranges`` (committed records only)."""
    quiet_group_id_warning(spark)
    return spark.read.format("kafka").options(**reader_options(pipeline, ranges)).load()


_QUIETED: dict[Hashable, tuple[Any, Any]] = {}  # per_jvm: done once per JVM


def quiet_group_id_warning(spark: SparkSession) -> None:
    """Keep Spark's Kafka source from logging, for every checkpoint, its warning that
    ``kafka.group.id`` is set: it is about consumers that subscribe (several queries of one
    group sharing its partitions); eo's reads assign their partitions. Raises the level of
    that one logger (``org.apache.spark.sql.kafka010.KafkaSourceProvider``) to ERROR, once per
    JVM; a JVM without log4j 2 keeps its logging as it is."""

    def quiet() -> bool:
        try:
            jvm: Any = spark.sparkContext._jvm
            level = jvm.org.apache.logging.log4j.Level.ERROR
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                "org.apache.spark.sql.kafka010.KafkaSourceProvider", level
            )
        except Exception:  # not a classic (py4j) session, or another logging backend
            return False
        return True

    per_jvm(_QUIETED, "kafka-source-provider", quiet)


def driver_source(spark: SparkSession, pipeline: Pipeline, live: list[RangeSpec]) -> DataFrame | None:
    """The records of ``live`` (ranges that hold offsets) read by the driver, as a DataFrame
    with the columns and values Spark's Kafka source gives; ``None`` when the ranges span
    more than :data:`DRIVER_READ_MAX_RECORDS` offsets or the driver's read met anything but
    records (:func:`~airflow_provider_eo.kafka.source_read.read_records`): Spark's Kafka
    source reads them then, and explains a refusal or a lost range as it always does."""
    from pyspark import SparkContext

    from airflow_provider_eo.kafka.source_read import read_records

    if sum(r.end - r.start for r in live) > DRIVER_READ_MAX_RECORDS:
        return None
    jvm = id(SparkContext._gateway)
    if jvm in _ARROW_REFUSED:
        return None
    spans = [(r.topic, r.partition, r.start, r.end) for r in live]
    table = read_records(pipeline.kafka, spans, group=DRIVER_READER_GROUP)
    if table is None:
        return None
    try:
        return spark.createDataFrame(table, schema=_kafka_schema(headers=False))
    except Exception as exc:  # the driver JVM cannot take Arrow data: read with Spark from now on
        _ARROW_REFUSED.add(jvm)
        _LOG.warning(
            "pipeline %r: this Spark driver cannot build a DataFrame from Arrow data (%s); its "
            "small checkpoints are read with Spark's Kafka source. A driver JVM started without "
            "Spark's Java module options (which spark-submit's launcher adds) "
            "needs --add-opens=java.base/java.nio=ALL-UNNAMED and "
            "-Dio.netty.tryReflectionSetAccessible=true in spark.driver.extraJavaOptions.",
            pipeline.name,
            str(exc).splitlines()[0][:300],
        )
        return None


def _kafka_schema(*, headers: bool) -> Any:
    """The Kafka source's schema (with its ``headers`` column or without)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def empty_source(spark: SparkSession) -> DataFrame:
    """An empty DataFrame with the Kafka source's schema (a checkpoint with nothing to read)."""
    return spark.createDataFrame([], _kafka_schema(headers=True))


def read_ranges(
    spark: SparkSession,
    pipeline: Pipeline,
    ranges: list[RangeSpec],
    *,
    time_filter: tuple[int, int] | None = None,
    driver_read: bool = False,
) -> DataFrame:
    """The planned ranges (or an empty frame when none holds an offset); ``driver_read``:
    read by the driver when they are small enough (:func:`driver_source`; the caller's
    choice: a checkpoint staged by the driver, whose rows come here anyway).

    ``time_filter`` (a backfill checkpoint's ``(start_ms, end_ms)``): only the records whose
    Kafka timestamp is in ``[start_ms, end_ms)``. Applied before anything observes the
    frame, so the counts and min/max timestamps recorded at prepare are the filtered ones.
    """
    live = live_ranges(ranges)
    if not live:
        frame = empty_source(spark)
    else:
        read = driver_source(spark, pipeline, live) if driver_read else None
        frame = read if read is not None else kafka_source(spark, pipeline, ranges)
    if time_filter is None:
        return frame
    from pyspark.sql import functions as F

    start_ms, end_ms = time_filter
    stamp = F.unix_millis(F.col("timestamp"))
    return frame.where((stamp >= F.lit(start_ms)) & (stamp < F.lit(end_ms)))


def without_positions(source: DataFrame, positions: Collection[tuple[str, int, int]]) -> DataFrame:
    """``source`` without the records at ``positions`` ((topic, partition, offset): the
    checkpoint's dead letters, which the transform never sees again)."""
    if not positions:
        return source
    from pyspark.sql import functions as F

    keep = F.lit(True)
    by_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in positions:
        by_partition.setdefault((topic, partition), []).append(offset)
    for (topic, partition), offsets in sorted(by_partition.items()):
        hit = (F.col("topic") == topic) & (F.col("partition") == partition) & F.col("offset").isin(offsets)
        keep = keep & ~hit
    return source.where(keep)


_PROVENANCE: dict[Hashable, tuple[Any, Any]] = {}  # expressions.per_jvm cache


def with_provenance(source: DataFrame) -> DataFrame:
    """``source`` plus the :data:`PROVENANCE_COLUMN` struct the transform may pass through
    (its expression built once per JVM)."""

    def build() -> Column:
        from pyspark.sql import functions as F

        return F.struct(F.col("topic"), F.col("partition"), F.col("offset"))

    return source.withColumn(PROVENANCE_COLUMN, per_jvm(_PROVENANCE, "provenance", build))


_METRICS: dict[Hashable, tuple[Any, Any]] = {}  # expressions.per_jvm cache


def range_metrics(live: list[RangeSpec]) -> list[Column]:
    """Aggregates ``n<i>``, ``lo<i>``, ``hi<i>``: records read and min/max timestamp (epoch ms)
    of the i-th live range, for :meth:`DataFrame.observe` of the bounded read of ``live``
    during the write. They depend on the ranges' topics and partitions only, which a
    stream's checkpoints share: built once per JVM and partition list.

    A read of one topic holds no other topic's records, so there a range is told by its
    partition alone: no string comparison per range and record (3 per live range), and
    less for Spark to analyze each checkpoint (a 64-partition observation: 30 -> 23 ms)."""
    key = tuple((r.topic, r.partition) for r in live)
    one_topic = len({topic for topic, _ in key}) == 1

    def build() -> list[Column]:
        from pyspark.sql import functions as F

        metrics = []
        for i, (topic, partition) in enumerate(key):
            hit = F.col("partition") == partition
            if not one_topic:
                hit = (F.col("topic") == topic) & hit
            ts = F.when(hit, F.unix_millis(F.col("timestamp")))
            metrics += [
                F.count(F.when(hit, 1)).alias(f"n{i}"),
                F.min(ts).alias(f"lo{i}"),
                F.max(ts).alias(f"hi{i}"),
            ]
        return metrics

    return per_jvm(_METRICS, key, build)


def range_reads(live: list[RangeSpec], stats: dict[str, Any]) -> list[RangeRead]:
    """What was read of each live range, from the observed :func:`range_metrics`: records
    counted, never ``end - start`` (a transactional input has offset gaps), and the min/max
    record timestamp."""
    return [
        RangeRead(r, int(stats.get(f"n{i}") or 0), stats.get(f"lo{i}"), stats.get(f"hi{i}"))
        for i, r in enumerate(live)
    ]
