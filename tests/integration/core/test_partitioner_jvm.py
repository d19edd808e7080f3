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


def test_registered_once_per_session_and_in_every_new_session(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint asks for the JVM partitioner: the first ask in a JVM session registers
    it, later ones do not (no py4j calls, no "replaced a registered function" warning); a new
    session of the same JVM (e.g. a streaming query's) registers it in its own registry."""
    from pyspark.sql import functions as F
    from pyspark.sql.udf import UDFRegistration

    calls: list[str] = []
    real = UDFRegistration.registerJavaFunction

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(str(self.sparkSession._jsparkSession.sessionUUID()))
        real(self, *args, **kwargs)

    monkeypatch.setattr(UDFRegistration, "registerJavaFunction", counted)
    other = spark.newSession()
    for _ in range(3):
        assert register_java_partitioner(spark)
        assert register_java_partitioner(other)
    assert len(calls) <= 2 and len(set(calls)) == len(calls)  # at most once per session
    call = F.call_function("eo_kafka_partition", F.lit(b"k").cast("binary"), F.lit(3))
    assert other.range(1).select(call.alias("p")).first()["p"] == java_partition(b"k", 3)
