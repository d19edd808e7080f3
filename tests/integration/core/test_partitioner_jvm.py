"""Both sink partitioners in Spark (the JVM one from eo's jar, the Arrow fallback) agree with
the Java client's murmur2 (``java_partition`` is checked against Kafka's own vectors)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from airflow_provider_eo.kafka.partitioner import java_partition
from airflow_provider_eo.spark.udfs import kafka_partitioner, murmur2_partitioner, register_java_partitioner

pytestmark = [pytest.mark.spark]


def test_jvm_and_arrow_partitioners_match_the_java_client(spark: Any) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(7)
    keys: list[bytes | None] = [b"", b"a", b"ab", b"abc", b"abcd", "ключ".encode(), None]
    keys += [rng.randbytes(rng.randrange(0, 40)) for _ in range(2000)]
    df = spark.createDataFrame(list(enumerate(keys)), "i int, key binary")
    assert register_java_partitioner(spark), "the test session must carry eo's jar"
    for n in (1, 3, 12, 1000):
        jvm, arrow = kafka_partitioner(spark, n), murmur2_partitioner(n)
        rows = df.select("i", jvm(F.col("key")).alias("j"), arrow(F.col("key")).alias("a")).orderBy("i")
        got = rows.collect()
        expected = [None if k is None else java_partition(k, n) for k in keys]
        assert [r["j"] for r in got] == expected
        assert [r["a"] for r in got] == [-1 if e is None else e for e in expected]
        plan = rows._jdf.queryExecution().executedPlan().toString()
        assert "eo_kafka_partition" in plan
