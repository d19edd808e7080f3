"""Transforms used by the tests. Importable by Spark's Python workers (tests/ is on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

# Flipped by tests to show that a fixed transform makes a refused checkpoint retryable.
STATE: dict[str, Any] = {"broken": True}


def identity(df: Any) -> Any:
    """Copy key and value."""
    return df


def drop_value_while_broken(df: Any) -> Any:
    """Returns no 'value' column while STATE['broken'] is true."""
    return df.select("key") if STATE["broken"] else df


def big_values(df: Any) -> Any:
    """Every value becomes 5000 bytes (over a small max.message.bytes)."""
    from pyspark.sql import functions as F

    return df.withColumn("value", F.repeat(F.lit("x"), 5000))


def poison(df: Any) -> Any:
    """A Python UDF that raises on the record whose value is b'POISON'."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def check(v: bytes) -> bytes:
        if bytes(v) == b"POISON":
            raise ValueError("cannot parse record: POISON")
        return bytes(v)

    return df.withColumn("value", F.udf(check, BinaryType())(F.col("value")))


def explode_twice(df: Any) -> Any:
    """Two output records per input (provenance must still be exact)."""
    from pyspark.sql import functions as F

    return df.withColumn("n", F.explode(F.array(F.lit(1), F.lit(2)))).withColumn(
        "value", F.concat(F.col("value"), F.lit(b"#"), F.col("n").cast("string").cast("binary"))
    )


def reshuffled(df: Any) -> Any:
    """Round-robin repartition: records of every source partition spread over all tasks."""
    return df.repartition(5)
