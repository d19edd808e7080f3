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


def needs_missing_module(df: Any) -> Any:
    """A Python UDF whose module is missing on the executors (as when the transform's
    package was not shipped with py_files): every record fails with ModuleNotFoundError."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def parse(v: bytes) -> bytes:
        import eo_not_shipped_to_executors  # type: ignore[import-not-found]  # noqa: F401

        return bytes(v)

    return df.withColumn("value", F.udf(parse, BinaryType())(F.col("value")))


def always_fails(df: Any) -> Any:
    """A Python UDF with a bug that fails on every record (not a bad record)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def parse(v: bytes) -> bytes:
        return bytes(v).decode().upper().encode() + v.missing_attribute  # type: ignore[attr-defined,no-any-return]

    return df.withColumn("value", F.udf(parse, BinaryType())(F.col("value")))


def drop_multiples_of_ten(df: Any) -> Any:
    """Keeps the records whose number (``k<key>:<n>``) is not a multiple of ten: the
    transform drops a tenth of the source on purpose."""
    from pyspark.sql import functions as F

    n = F.substring_index(F.col("value").cast("string"), ":", -1).cast("long")
    return df.where(n % 10 != 0)


def drop_and_explode(df: Any) -> Any:
    """Drops the multiples of ten and writes the other multiples of five twice: the output
    has more records than the source records it keeps (only provenance tells which source
    records are gone)."""
    from pyspark.sql import functions as F

    n = F.substring_index(F.col("value").cast("string"), ":", -1).cast("long")
    kept = df.where(n % 10 != 0)
    copies = F.when(n % 5 == 0, F.array(F.lit(1), F.lit(2))).otherwise(F.array(F.lit(1)))
    return kept.withColumn("copy", F.explode(copies))


def poison_or_big(df: Any) -> Any:
    """Raises (a Python UDF) on a value starting with b'POISON'; a value starting with b'BIG'
    becomes 5000 bytes (over a small max.message.bytes); any other value is kept."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def check(v: bytes) -> bytes:
        v = bytes(v)
        if v.startswith(b"POISON"):
            raise ValueError(f"cannot parse record: {v.decode()}")
        return b"x" * 5000 if v.startswith(b"BIG") else v

    return df.withColumn("value", F.udf(check, BinaryType())(F.col("value")))


def poison_prefix(df: Any) -> Any:
    """Fails on a value starting with b'POISON' with a Spark arithmetic error (an integral
    division by zero under ANSI mode, Spark 4's default), without a Python UDF; any other
    value is kept as it is. A poison record for long runs (bench/torture.py) that costs no
    Python worker on the records that are fine."""
    from pyspark.sql import functions as F

    return df.withColumn(
        "value",
        F.expr(
            "CASE WHEN substring(value, 1, 6) = X'504F49534F4E' THEN concat(value, "
            "cast(cast(length(value) div (length(value) - length(value)) AS STRING) AS BINARY)) "
            "ELSE value END"
        ),
    )


def readme_clean(df: Any) -> Any:
    """The README's example transform ``clean``: a filter, then a select that keeps only key
    and value (the provenance column is not named, so not kept)."""
    from pyspark.sql import functions as F

    return df.where(F.col("value").isNotNull()).select(
        "key", F.upper(F.col("value").cast("string")).alias("value")
    )


def select_udf(df: Any) -> Any:
    """``select("key", udf(value))``: a Python UDF, only key and value kept."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    upper = F.udf(lambda v: bytes(v).upper(), BinaryType())  # no hints: a plain Python UDF
    return df.select("key", upper(F.col("value")).alias("value"))


def select_pandas_udf(df: Any) -> Any:
    """A pandas UDF in a select that keeps only key and value."""
    import pandas as pd
    from pyspark.sql import functions as F

    def upper(values: pd.Series) -> pd.Series:
        return values.map(lambda v: bytes(v).upper())

    # Spark reads the kind of pandas UDF from the hints: real types, not this module's
    # postponed (string) annotations.
    upper.__annotations__ = {"values": pd.Series, "return": pd.Series}
    return df.select("key", F.pandas_udf(upper, "binary")(F.col("value")).alias("value"))


def join_static(df: Any) -> Any:
    """A join with a small static table (by key), then a select of key and value."""
    from pyspark.sql import functions as F

    names = df.sparkSession.createDataFrame(
        [(f"k{i}".encode(), f"name-{i}") for i in range(7)], "key binary, name string"
    )
    joined = df.join(F.broadcast(names), "key", "left")
    return joined.select(
        "key", F.concat(F.col("value"), F.lit(b"|"), F.col("name").cast("binary")).alias("value")
    )


def count_per_key(df: Any) -> Any:
    """An aggregation: one output record per key and checkpoint (no output record stands
    for one source record)."""
    from pyspark.sql import functions as F

    return df.groupBy("key").agg(F.count(F.lit(1)).cast("string").alias("value"))


def poison_big_twice_headers(df: Any) -> Any:
    """:func:`poison_or_big`, then: a value starting with b'TWICE' becomes two records (the
    second suffixed b'-2'), and every record gets a header ``len`` (its value's length)."""
    from pyspark.sql import functions as F

    out = poison_or_big(df)
    copies = F.when(F.col("value").startswith(F.lit(b"TWICE")), F.array(F.lit(1), F.lit(2))).otherwise(
        F.array(F.lit(1))
    )
    out = out.withColumn("copy", F.explode(copies))
    value = F.when(F.col("copy") == 2, F.concat(F.col("value"), F.lit(b"-2"))).otherwise(F.col("value"))
    header = F.struct(F.lit("len").alias("key"), F.length(value).cast("string").cast("binary").alias("value"))
    return out.select(
        "key",
        value.alias("value"),
        F.array(header).alias("headers"),
        *[c for c in out.columns if c.startswith("_eo")],
    )
