"""Sink-partition functions for Spark: the JVM one from eo's jar, or an Arrow UDF.

No ``from __future__ import annotations`` here: arrow_udf reads the type hints at runtime.
"""

import sys
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from airflow_provider_eo.kafka.partitioner import java_partitions

KAFKA_PARTITION_FUNCTION = "eo_kafka_partition"
_FALLBACK_LOGGED = False


def murmur2_partitioner(partitions: int):  # type: ignore[no-untyped-def]
    """An Arrow UDF: the Java client's partition of each non-null key (``-1`` for null).

    Arrow in, numpy murmur2 over the whole batch, Arrow out: no Python object per key.
    """
    from pyspark.sql.functions import arrow_udf

    def sink_partition(keys: pa.Array) -> pa.Array:
        return java_partitions(keys, partitions)

    return arrow_udf(sink_partition, "int")  # type: ignore[call-overload,unused-ignore]


def register_java_partitioner(spark: Any) -> bool:
    """Register ``eo_kafka_partition(key, partitions)`` (the JVM class from eo's jar) in
    ``spark``; False when the session's classpath does not have it."""
    from airflow_provider_eo.stack.javac import KAFKA_PARTITION_CLASS

    try:
        spark.udf.registerJavaFunction(KAFKA_PARTITION_FUNCTION, KAFKA_PARTITION_CLASS, "int")
    except Exception:  # class not on the classpath (a session built without eo's jars)
        return False
    return True


def kafka_partitioner(spark: Any, partitions: int, *, registered: bool | None = None) -> Callable[[Any], Any]:
    """Column -> the Java client's partition of each key: in the JVM when eo's jar is on the
    session's classpath (no Python worker round trip), else the Arrow UDF above.
    ``registered``: what :func:`register_java_partitioner` already returned for ``spark``."""
    from pyspark.sql import functions as F

    if registered if registered is not None else register_java_partitioner(spark):
        return lambda key: F.call_function(KAFKA_PARTITION_FUNCTION, key, F.lit(partitions))
    global _FALLBACK_LOGGED
    if not _FALLBACK_LOGGED:
        _FALLBACK_LOGGED = True
        print(
            "eo: the JVM partitioner (eo.spark.KafkaPartition) is not on this Spark session's "
            "classpath (`eo setup jars` builds it); sink partitions are computed by the Arrow UDF "
            "(same result, slower)",
            file=sys.stderr,
            flush=True,
        )
    return murmur2_partitioner(partitions)
