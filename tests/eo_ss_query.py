"""A Structured Streaming query writing through ``KafkaExactlyOnceSink``, run as its own
process so a test can kill it (``EO_FAULT``) and restart it from the same checkpoint location.

``python tests/eo_ss_query.py '<json>'`` with: bootstrap, source, sink, name, ledger_url,
staging_dir, checkpoint, kind (``count``: running count per key, update mode; ``dedup``:
``dropDuplicatesWithinWatermark`` on the value, append mode; ``random``: the value carries
``rand()`` and this process's tag; ``identity``: key and value unchanged), commit_shards,
max_offsets (per trigger), trigger_s, spark_conf (more settings of the query's session, also
given to the sink: e.g. ``spark.hadoop.fs.s3a.*`` for an ``s3a://`` staging_dir). The
query runs with ``availableNow`` (it processes what the source holds, in batches, then exits
0), or with a processing-time trigger of ``trigger_s`` seconds until it is stopped (a stop
request in the ledger: ``eo stream-stop``).
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any


def main(spec: dict[str, object]) -> None:
    from pyspark.sql import functions as F

    from airflow_provider_eo.spark.session import get_spark

    extra = dict(spec.get("spark_conf") or {})  # type: ignore[call-overload]
    spark = get_spark(f"eo-ss-{spec['name']}", conf={"spark.sql.shuffle.partitions": "2", **extra})
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", str(spec["bootstrap"]))
        .option("subscribe", str(spec["source"]))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", int(spec.get("max_offsets", 40)))  # type: ignore[call-overload]
        .load()
    )
    kind = spec["kind"]
    if kind == "count":
        out = (
            source.groupBy(F.col("key"))
            .count()
            .select(
                F.col("key"), F.concat_ws("=", F.col("key").cast("string"), F.col("count")).alias("value")
            )
        )
        mode = "update"
    elif kind == "dedup":
        out = (
            source.withWatermark("timestamp", "1 hour")
            .dropDuplicatesWithinWatermark(["value"])
            .select(F.col("key"), F.col("value"))
        )
        mode = "append"
    elif kind == "identity":
        out = source.select(F.col("key"), F.col("value"))
        mode = "append"
    else:
        tag = uuid.uuid4().hex[:8]
        out = source.select(
            F.col("key"),
            F.concat_ws("|", F.col("value").cast("string"), F.lit(tag), F.rand().cast("string")).alias(
                "value"
            ),
        )
        mode = "append"
    if spec.get("sink_ref"):  # the sink an Airflow task also imports (tests/eo_ss_sinks.py)
        import importlib

        module_name, _, attr = str(spec["sink_ref"]).partition(":")
        sink = getattr(importlib.import_module(module_name), attr)
    else:
        sink = _sink(spec)
    trigger_s = spec.get("trigger_s")
    query = sink.start(
        out,
        str(spec["checkpoint"]),
        output_mode=mode,
        available_now=trigger_s is None,
        trigger_interval=f"{trigger_s} seconds" if trigger_s else None,
    )
    query.awaitTermination()
    sink.close()
    spark.stop()


def _sink(spec: dict[str, Any]) -> Any:
    from airflow_provider_eo.streaming import KafkaExactlyOnceSink

    return KafkaExactlyOnceSink(
        name=str(spec["name"]),
        kafka={"bootstrap.servers": str(spec["bootstrap"])},
        sink_topic=str(spec["sink"]),
        ledger_url=str(spec["ledger_url"]),
        staging_dir=str(spec["staging_dir"]),
        commit_shards=int(spec.get("commit_shards", 1)),  # type: ignore[call-overload]
        commit_mode="local",
        heartbeat_s=1.0,
        **({"spark_conf": dict(spec["spark_conf"])} if spec.get("spark_conf") else {}),
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
