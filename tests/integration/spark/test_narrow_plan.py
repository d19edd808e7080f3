"""The staged write decides from the analyzed plan, without planning it, whether a transform
needs a shuffle; every plan it accepts must plan without an exchange, in one task per range read.

Each case builds the frame the prepare writes (bounded Kafka read, range observations,
provenance, the transform, the staged columns, the limit observations) over a real topic, and
compares ``write.kafka_narrow`` with Spark's physical plan of the same frame.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import shape, source, write

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SINK_PARTITIONS = 3


def _upper(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.withColumn("value", F.upper(F.col("value").cast("string")))


def _python_udf(df: Any) -> Any:
    from pyspark.sql import functions as F

    twice = F.udf(lambda v: (v or "") * 2, "string")
    return df.withColumn("value", twice(F.col("value").cast("string")))


def _explode(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.withColumn("value", F.explode(F.split(F.col("value").cast("string"), "-")))


def _filter(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.where(F.col("offset") % 2 == 0)


def _map_in_arrow(df: Any) -> Any:
    return df.mapInArrow(lambda batches: batches, df.schema)


def _count_per_key(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy("key").agg(F.count("*").cast("string").alias("value"))


def _repartition(df: Any) -> Any:
    return df.repartition(4)


def _coalesce(df: Any) -> Any:
    return df.coalesce(1)


def _union(df: Any) -> Any:
    return df.union(df)


def _limit(df: Any) -> Any:
    return df.limit(5)


def _distinct(df: Any) -> Any:
    return df.select("key", "value").distinct()


def _in_subquery(df: Any) -> Any:
    df.createOrReplaceTempView("eo_narrow_plan_src")
    return df.sparkSession.sql(
        "select * from eo_narrow_plan_src where partition in "
        "(select partition from eo_narrow_plan_src where offset > 3)"
    )


def _scalar_subquery(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.where(F.col("offset") < df.select(F.max("offset")).scalar())


NARROW = [_upper, _python_udf, _explode, _filter, _map_in_arrow]
NOT_NARROW = [
    _count_per_key,
    _repartition,
    _coalesce,
    _union,
    _limit,
    _distinct,
    _in_subquery,
    _scalar_subquery,
]


@pytest.fixture(scope="module")
def topic(kafka_config: dict[str, Any]) -> Iterator[str]:
    """Three partitions; the third stays empty (its range is not read)."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    name = f"narrow-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_config, name, partitions=3)
    producer = Producer(kafka_config)
    for i in range(40):
        producer.produce(name, key=f"k{i % 5}".encode(), value=f"a-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    yield name


def _staged(spark: Any, kafka_config: dict[str, Any], topic: str, transform: Callable[[Any], Any]) -> Any:
    """The frame the prepare writes for ``transform`` (see SparkStager._write)."""
    from pyspark.sql import Observation

    pipeline = Pipeline(
        name="narrow-plan",
        kafka=dict(kafka_config),
        source_topics=[topic],
        sink_topic="unused",
        transform="unused:unused",
        ledger_url="sqlite:///unused.db",
        staging_dir="/unused",
    )
    ranges = [RangeSpec(topic, 0, 0, 20), RangeSpec(topic, 1, 0, 20), RangeSpec(topic, 2, 0, 0)]
    frame = source.read_ranges(spark, pipeline, ranges)
    frame = frame.observe(Observation(), *source.range_metrics(source.live_ranges(ranges)))
    frame = source.with_provenance(frame)
    staged = shape.staged_frame(transform(frame), SINK_PARTITIONS, "narrow-plan", frame)
    return shape.observe_limits(staged, Observation(), 1_000_000, SINK_PARTITIONS)


def _physical(df: Any) -> tuple[bool, int]:
    """(whether Spark's physical plan has a non-broadcast exchange, its task count)."""
    qe = df._jdf.queryExecution()
    shuffles = bool(re.search(r"(?<!Broadcast)Exchange", qe.executedPlan().toString()))
    return shuffles, int(qe.toRdd().getNumPartitions())


@pytest.mark.parametrize("transform", NARROW, ids=lambda f: f.__name__)
def test_a_narrow_transform_is_decided_without_planning_and_spark_agrees(
    transform: Callable[[Any], Any], spark: Any, kafka_config: dict[str, Any], topic: str
) -> None:
    staged = _staged(spark, kafka_config, topic, transform)
    assert write.kafka_narrow(staged)
    assert write.narrow_tasks(staged, source_tasks=2) == 2
    assert _physical(staged) == (False, 2)  # two non-empty ranges, one task each


@pytest.mark.parametrize("transform", NOT_NARROW, ids=lambda f: f.__name__)
def test_any_other_plan_is_planned_as_before(
    transform: Callable[[Any], Any], spark: Any, kafka_config: dict[str, Any], topic: str
) -> None:
    staged = _staged(spark, kafka_config, topic, transform)
    assert not write.kafka_narrow(staged)
    shuffles, tasks = _physical(staged)
    assert write.narrow_tasks(staged, source_tasks=2) == (None if shuffles else tasks)


def test_a_frame_not_read_from_kafka_is_planned(spark: Any) -> None:
    frame = spark.range(10).selectExpr("cast(id as string) as value")
    assert not write.kafka_narrow(frame)
    assert write.narrow_tasks(frame, source_tasks=7) == frame.rdd.getNumPartitions()
