"""Vectorized UDFs shipped to Spark's Python workers.

No ``from __future__ import annotations`` here: pandas_udf reads the type hints at runtime.
"""

import pandas as pd

from airflow_provider_eo.kafka.partitioner import java_partition


def murmur2_partitioner(partitions: int):  # type: ignore[no-untyped-def]
    """A pandas UDF: the Java client's partition of each non-null key (``-1`` for null)."""
    from pyspark.sql.functions import pandas_udf

    def sink_partition(keys: pd.Series) -> pd.Series:
        return keys.map(lambda k: java_partition(bytes(k), partitions) if k is not None else -1).astype(
            "int32"
        )

    return pandas_udf(sink_partition, "int")  # type: ignore[call-overload]
