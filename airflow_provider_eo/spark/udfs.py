"""Vectorized UDFs shipped to Spark's Python workers.

No ``from __future__ import annotations`` here: arrow_udf reads the type hints at runtime.
"""

import pyarrow as pa

from airflow_provider_eo.kafka.partitioner import java_partitions


def murmur2_partitioner(partitions: int):  # type: ignore[no-untyped-def]
    """An Arrow UDF: the Java client's partition of each non-null key (``-1`` for null).

    Arrow in, numpy murmur2 over the whole batch, Arrow out: no Python object per key.
    """
    from pyspark.sql.functions import arrow_udf

    def sink_partition(keys: pa.Array) -> pa.Array:
        return java_partitions(keys, partitions)

    return arrow_udf(sink_partition, "int")  # type: ignore[call-overload,unused-ignore]
