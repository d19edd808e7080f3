"""Example transforms: each takes the Kafka source DataFrame and returns the output one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def enrich(df: DataFrame) -> DataFrame:
    """Parse JSON order events, add ``amount_cents`` and a ``tier``, keep the key."""
    from pyspark.sql import functions as F

    schema = "batch INT, seq INT, user STRING, amount INT"
    parsed = df.withColumn("event", F.from_json(F.col("value").cast("string"), schema))
    enriched = F.struct(
        F.col("event.user").alias("user"),
        F.col("event.amount").alias("amount"),
        (F.col("event.amount") * 100).alias("amount_cents"),
        F.when(F.col("event.amount") >= 50, "gold").otherwise("standard").alias("tier"),
        F.col("topic").alias("source_topic"),
        F.col("offset").alias("source_offset"),
    )
    return parsed.withColumn("value", F.to_json(enriched))


def upper(df: DataFrame) -> DataFrame:
    """Upper-case the value (string)."""
    from pyspark.sql import functions as F

    return df.withColumn("value", F.upper(F.col("value").cast("string")))
