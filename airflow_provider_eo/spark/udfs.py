"""Sink-partition functions for Spark: the JVM one from eo's jar, or an Arrow UDF.

No ``from __future__ import annotations`` here: arrow_udf reads the type hints at runtime.
"""

import sys
from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa

from airflow_provider_eo.kafka.partitioner import java_partitions
from airflow_provider_eo.spark.expressions import per_jvm

KAFKA_PARTITION_FUNCTION = "eo_kafka_partition"
_FALLBACK_LOGGED = False
_REGISTERED: "dict[Hashable, tuple[Any, Any]]" = {}  # per_jvm: JVM session id -> registered


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
    ``spark``; False when the session's classpath does not have it.

    Once per JVM session (its function registry holds the function): registering again every
    checkpoint cost py4j round trips and logged Spark's "replaced a previously registered
    function" warning each time. A foreachBatch frame brings a new Python session object for
    the same JVM session, so the JVM session's id is the key."""
    from airflow_provider_eo.stack.javac import KAFKA_PARTITION_CLASS

    def register() -> bool:
        try:
            spark.udf.registerJavaFunction(KAFKA_PARTITION_FUNCTION, KAFKA_PARTITION_CLASS, "int")
        except Exception:  # class not on the classpath (a session built without eo's jars)
            return False
        return True

    try:
        session_id = str(spark._jsparkSession.sessionUUID())
    except Exception:  # not a classic (py4j) session
        return register()
    return per_jvm(_REGISTERED, session_id, register)


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
