"""Prepare one checkpoint with PySpark: read exactly its planned ranges, transform, stage.

Runnable by ``spark-submit`` (``spark-submit .../prepare.py --pipeline mod:ATTR --checkpoint N``)
or in-process from ``eo prepare``. Never imports Airflow.

The steps, in order (each one safe to repeat after a crash):

1. Read the checkpoint from the ledger. PREPARED/COMMITTED: nothing to do. ABORTED: refuse.
2. Bounded read of exactly the planned ranges (``startingOffsets``/``endingOffsets``,
   ``read_committed``, ``failOnDataLoss``), then the user's transform.
3. Assign sink partitions (explicit ``partition`` column, else murmur2 of the key like the
   Java client, else a hash of the source position), keep source order within a partition,
   and write Parquet under a fresh attempt-scoped folder. A transform without a shuffle is
   written without one too (each source task writes its own files, in source order);
   otherwise the rows are repartitioned by sink partition and sorted back to source order.
4. Check every record against the sink's ``max.message.bytes`` and partition count
   (counted during the write; the files are read back only to name an offender).
5. Write the manifest (files, counts, checksums) last; then PLANNED -> PREPARED in the
   ledger naming this attempt. A losing attempt deletes its own folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.errors import PrepareError, TransformError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import java_client_options, librdkafka_config
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointConflict,
    CheckpointRecord,
    CheckpointState,
    Ledger,
    RangeSpec,
)
from airflow_provider_eo.pipeline import Pipeline, load_pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Bytes a record adds on the wire beyond key, value and headers (record + batch framing),
# plus our provenance headers; used for the max.message.bytes check.
RECORD_OVERHEAD_BYTES = 200
PARQUET_ROW_GROUP_BYTES = 8 * 1024 * 1024
# A shuffle-free write leaves up to (tasks x sink partitions) files; above this, shuffle.
MAX_UNSHUFFLED_FILES = 1024


@dataclass(frozen=True)
class PrepareResult:
    """What one prepare call did."""

    checkpoint: CheckpointRecord
    attempt: str | None  # None when nothing had to be done
    records: int
    records_read: int
    seconds: float
    note: str = ""


def _kafka_source(spark: SparkSession, pipeline: Pipeline, ranges: list[RangeSpec]) -> DataFrame:
    live = [r for r in ranges if r.end > r.start]
    options = java_client_options(pipeline.kafka)
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in live:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    reader = spark.read.format("kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.option("kafka.isolation.level", "read_committed")  # never aborted/open txn data
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        # Offsets that vanished between plan and read are loud, never skipped.
        .option("failOnDataLoss", "true")
        .load()
    )


def _empty_source(spark: SparkSession) -> DataFrame:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            ),
        ]
    )
    return spark.createDataFrame([], schema)


def load_transform(ref: str | None) -> Callable[[DataFrame], DataFrame]:
    """Import the pipeline's ``module:function`` transform (identity when ``None``)."""
    if ref is None:
        return lambda df: df
    module_name, func = ref.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module_name), func)
    except (ImportError, AttributeError) as exc:
        raise PrepareError(f"cannot load transform {ref!r}: {exc}") from exc
    if not callable(fn):
        raise PrepareError(f"transform {ref!r} is not callable")
    return fn  # type: ignore[no-any-return,unused-ignore]


def _expr_id(df: DataFrame, name: str) -> int | None:
    """The analyzed plan's expression id of column ``name`` (None when unknown)."""
    try:
        output = df._jdf.queryExecution().analyzed().output()
        for i in range(output.size()):
            attr = output.apply(i)
            if attr.name() == name:
                return int(attr.exprId().id())
    except Exception:  # not a classic (py4j) DataFrame
        return None
    return None


def _staged_frame(
    out: DataFrame, sink_partitions: int, checkpoint: CheckpointRecord, source: DataFrame | None = None
) -> DataFrame:
    """Validate the transform's output and shape it into the staged columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructType,
    )

    cols = set(out.columns)
    if "partition" in cols and source is not None:
        # The source's own `partition` column passed through untouched is the *source*
        # partition, not a request for a sink partition: keys are hashed like Java then.
        source_id = _expr_id(source, "partition")
        if source_id is not None and source_id == _expr_id(out, "partition"):
            cols.discard("partition")
    where = f"pipeline {checkpoint.pipeline!r}, checkpoint {checkpoint.checkpoint_id}"
    if "value" not in cols:
        raise PrepareError(
            f"{where}: the transform's output has no 'value' column (columns: "
            f"{sorted(c for c in cols if not c.startswith('_eo'))}); return a DataFrame with "
            "'value' (binary or string) and optionally 'key', 'headers', 'partition'"
        )
    fields = {f.name: f.dataType for f in out.schema.fields}

    def as_binary(name: str) -> Any:
        dtype = fields[name]
        if isinstance(dtype, BinaryType):
            return F.col(name)
        if isinstance(dtype, StringType):
            return F.col(name).cast("binary")
        raise PrepareError(
            f"{where}: output column {name!r} has type {dtype.simpleString()}; it must be "
            "binary or string (serialize it, e.g. F.to_json(...))"
        )

    value = as_binary("value")
    key = as_binary("key") if "key" in cols else F.lit(None).cast("binary")
    if "headers" in cols:
        htype = fields["headers"]
        ok = (
            isinstance(htype, ArrayType)
            and isinstance(htype.elementType, StructType)
            and {f.name for f in htype.elementType.fields} >= {"key", "value"}
        )
        if not ok:
            raise PrepareError(
                f"{where}: output column 'headers' must be array<struct<key:string,value:binary>>"
            )
        headers = F.col("headers")
    else:
        headers = F.lit(None).cast("array<struct<key:string,value:binary>>")
    if "_eo_src" in cols:
        src_topic = F.col("_eo_src.topic")
        src_partition = F.col("_eo_src.partition")
        src_offset = F.col("_eo_src.offset")
    else:  # the transform dropped provenance: order by output position instead
        src_topic = F.lit(None).cast(StringType())
        src_partition = F.lit(None).cast(IntegerType())
        src_offset = F.lit(None).cast(LongType())
    shaped = out.select(
        key.alias("key"),
        value.alias("value"),
        headers.alias("headers"),
        src_topic.alias("src_topic"),
        src_partition.alias("src_partition"),
        src_offset.alias("src_offset"),
        (F.col("partition").cast("int") if "partition" in cols else F.lit(None).cast("int")).alias(
            "explicit_partition"
        ),
    ).withColumn("seq", F.monotonically_increasing_id())
    from airflow_provider_eo.spark.udfs import kafka_partitioner

    murmur = kafka_partitioner(out.sparkSession, sink_partitions)
    fallback = F.pmod(F.xxhash64("src_topic", "src_partition", "src_offset", "seq"), F.lit(sink_partitions))
    sink_partition = (
        F.when(F.col("explicit_partition").isNotNull(), F.col("explicit_partition"))
        .when(F.col("key").isNotNull(), murmur(F.col("key")))
        .otherwise(fallback.cast("int"))
    )
    header_bytes = F.coalesce(
        F.aggregate(
            F.col("headers"),
            F.lit(0).cast("long"),
            lambda acc, h: acc + F.length(h["key"]) + F.coalesce(F.length(h["value"]), F.lit(0)),
        ),
        F.lit(0).cast("long"),
    )
    size = (
        F.coalesce(F.length("value"), F.lit(0))
        + F.coalesce(F.length("key"), F.lit(0))
        + header_bytes
        + F.lit(RECORD_OVERHEAD_BYTES)
    )
    return shaped.withColumn("sink_partition", sink_partition).withColumn("size", size)


def _narrow_tasks(df: DataFrame) -> int | None:
    """How many Spark tasks produce ``df`` when its physical plan has no shuffle, else None.

    Without a shuffle every task holds whole, consecutive slices of source partitions (the
    Kafka source makes one task per offset range, split ranges in offset order), so sorting
    inside each task keeps source order, and Spark's file names (``part-<task>-…``) put a
    sink partition's files in task order: no repartition by sink partition is needed.
    """
    try:
        qe = df._jdf.queryExecution()
        if re.search(r"(?<!Broadcast)Exchange", qe.executedPlan().toString()):
            return None
        return int(qe.toRdd().getNumPartitions())
    except Exception:  # not a classic (py4j) DataFrame: take the general path
        return None


def _sink_max_message_bytes(pipeline: Pipeline) -> int:
    from confluent_kafka.admin import ConfigResource, ResourceType

    try:
        client = admin.admin_client(librdkafka_config(pipeline.kafka))
        futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, pipeline.sink_topic)])
        configs = next(iter(futures.values())).result(timeout=15)
        return int(configs["max.message.bytes"].value)
    except Exception:  # describe may be forbidden by ACLs: fall back to the setting
        return pipeline.sink_max_message_bytes


def _locate_poison(
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Callable[[DataFrame], DataFrame],
    ranges: list[RangeSpec],
    max_jobs: int = 40,
) -> tuple[str, int, int] | None:
    """Bisect the ranges for the first record the transform fails on (bounded Spark jobs)."""
    from pyspark.sql import functions as F

    jobs = 0

    def fails(r: RangeSpec) -> bool:
        nonlocal jobs
        jobs += 1
        src = _kafka_source(spark, pipeline, [r])
        src = src.withColumn("_eo_src", F.struct("topic", "partition", "offset"))
        try:
            transform(src).write.format("noop").mode("overwrite").save()
        except Exception:
            return True
        return False

    for r in ranges:
        if r.end <= r.start or jobs >= max_jobs or not fails(r):
            continue
        lo, hi = r.start, r.end  # the failure lies in [lo, hi)
        while hi - lo > 1 and jobs < max_jobs:
            mid = (lo + hi) // 2
            if fails(RangeSpec(r.topic, r.partition, lo, mid)):
                hi = mid
            else:
                lo = mid
        if hi - lo == 1:
            return (r.topic, r.partition, lo)
        return None
    return None


def _is_transform_failure(exc: BaseException) -> bool:
    """A failure raised by the user's code (a Python UDF, a Spark expression) rather than
    by Kafka or the filesystem."""
    from pyspark.errors import ArithmeticException, NumberFormatException, PythonException

    if isinstance(exc, (PythonException, ArithmeticException, NumberFormatException)):
        return True
    text = str(exc)
    return "PythonException" in text or "Python worker" in text or "SparkArithmeticException" in text


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the Python error line inside Spark's wrapper
        if "Error" in ln or "Exception" in ln:
            return ln.strip()[:500]
    return (lines[-1] if lines else type(exc).__name__)[:500]


def prepare_checkpoint(
    spark: SparkSession,
    pipeline: Pipeline,
    ledger: Ledger,
    checkpoint_id: int,
    *,
    attempt: str | None = None,
    actor: Actor | None = None,
) -> PrepareResult:
    """Stage the output of one PLANNED checkpoint and move it to PREPARED.

    Idempotent: preparing a PREPARED or COMMITTED checkpoint does nothing; two attempts
    racing both stage, exactly one wins the PLANNED -> PREPARED update, the other deletes
    its own folder.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
        return PrepareResult(cp, None, cp.records or 0, 0, 0.0, note=f"already {cp.state.value}")
    if cp.state is not CheckpointState.PLANNED:
        raise PrepareError(
            f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}; only "
            "PLANNED checkpoints can be prepared (an aborted range is replanned by the next plan)"
        )
    config = librdkafka_config(pipeline.kafka)
    sink_partitions = admin.partition_count(config, pipeline.sink_topic)
    admin.partitions_of(config, pipeline.source_topics)  # a deleted source is a clear error
    max_bytes = _sink_max_message_bytes(pipeline)
    attempt = attempt or f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    path = names.attempt_dir(pipeline, checkpoint_id, attempt)
    ranges = list(cp.ranges)
    live = [r for r in ranges if r.end > r.start]
    source = _kafka_source(spark, pipeline, ranges) if live else _empty_source(spark)
    # Per-range counts and min/max timestamps, computed during the write (no second read).
    metrics = []
    for i, r in enumerate(live):
        hit = (F.col("topic") == r.topic) & (F.col("partition") == r.partition)
        ts = F.when(hit, F.unix_millis(F.col("timestamp")))
        metrics += [
            F.count(F.when(hit, 1)).alias(f"n{i}"),
            F.min(ts).alias(f"lo{i}"),
            F.max(ts).alias(f"hi{i}"),
        ]
    observation = Observation(f"eo-{pipeline.name}-{checkpoint_id}-{attempt}")
    if metrics:
        source = source.observe(observation, *metrics)
    source = source.withColumn("_eo_src", F.struct("topic", "partition", "offset"))
    transform = load_transform(pipeline.transform)
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}"
    try:
        out = transform(source)
    except PrepareError:
        raise
    except Exception as exc:
        raise TransformError(f"{where}: transform {pipeline.transform!r} raised: {exc!r}") from exc
    staged = _staged_frame(out, sink_partitions, cp, source)
    # Limits checked during the write; the files are read back only to name an offender.
    limits = Observation(f"eo-{pipeline.name}-{checkpoint_id}-{attempt}-limits")
    staged = staged.observe(
        limits,
        F.count(F.when(F.col("size") > max_bytes, 1)).alias("oversize"),
        F.count(
            F.when((F.col("sink_partition") < 0) | (F.col("sink_partition") >= sink_partitions), 1)
        ).alias("bad_partition"),
    )
    narrow = _narrow_tasks(staged)
    if narrow is None or narrow * sink_partitions > MAX_UNSHUFFLED_FILES:
        # A shuffling transform (or too many small files otherwise): one task per sink
        # partition; the sort below restores source order inside it.
        tasks = max(1, min(sink_partitions, spark.sparkContext.defaultParallelism * 2))
        staged = staged.repartition(tasks, "sink_partition")
    try:
        (
            staged.sortWithinPartitions("sink_partition", "src_topic", "src_partition", "src_offset", "seq")
            .drop("explicit_partition")
            .write.mode("errorifexists")
            # Small row groups: the commit streams a row group at a time, so this bounds its
            # memory whatever the checkpoint size (Spark's default is 128 MB).
            .option("parquet.block.size", str(PARQUET_ROW_GROUP_BYTES))
            .partitionBy("sink_partition")
            .parquet(f"{path}/data")
        )
    except Exception as exc:
        staging.remove(path)
        message = _short(exc)
        if _is_transform_failure(exc):
            poison = _locate_poison(spark, pipeline, transform, live)
            at = f" at {poison[0]}[{poison[1]}] offset {poison[2]}" if poison else ""
            raise TransformError(
                f"{where}: transform {pipeline.transform!r} failed{at}: {message}. Nothing was "
                "published; fix the transform (or the record) and retry the prepare."
            ) from exc
        raise PrepareError(f"{where}: the Spark job failed: {message}") from exc
    fault_point("prepare.after_write")
    files = staging.describe_attempt(path)
    seen = limits.get if files else {}
    if seen.get("oversize"):
        first = (
            spark.read.parquet(f"{path}/data")
            .where(F.col("size") > max_bytes)
            .select("src_topic", "src_partition", "src_offset", "size")
            .first()
        )
        staging.remove(path)
        record = (
            f"an output record of {first['size']} bytes (from {first['src_topic']}"
            f"[{first['src_partition']}] offset {first['src_offset']})"
            if first is not None
            else "an output record"
        )
        raise PrepareError(
            f"{where}: {record} exceeds the sink topic {pipeline.sink_topic!r} "
            f"max.message.bytes={max_bytes} ({seen['oversize']} record(s) do); nothing was "
            "published. Shrink the record in the transform or raise the topic's max.message.bytes."
        )
    if seen.get("bad_partition"):
        bad = (
            spark.read.parquet(f"{path}/data")
            .where((F.col("sink_partition") < 0) | (F.col("sink_partition") >= sink_partitions))
            .select("sink_partition")
            .first()
        )
        staging.remove(path)
        raise PrepareError(
            f"{where}: the transform set partition={bad['sink_partition'] if bad else '?'} but "
            f"{pipeline.sink_topic!r} has {sink_partitions} partitions"
        )
    stats = observation.get if metrics else {}
    range_stats: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    manifest_ranges = []
    records_read = 0
    for i, r in enumerate(live):
        n = int(stats.get(f"n{i}") or 0)
        records_read += n
        range_stats[(r.topic, r.partition)] = (stats.get(f"lo{i}"), stats.get(f"hi{i}"))
        manifest_ranges.append(
            {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end, "read": n}
        )
    manifest = staging.Manifest(
        pipeline=pipeline.name,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        sink_topic=pipeline.sink_topic,
        sink_partitions=sink_partitions,
        files=files,
        records_read=records_read,
        ranges=manifest_ranges,
    )
    staging.write_manifest(path, manifest)
    fault_point("prepare.before_ledger")
    shard_counts: dict[int, int] = {}
    for partition, count in manifest.partition_counts().items():
        shard = names.shard_of(pipeline, partition, sink_partitions)
        shard_counts[shard] = shard_counts.get(shard, 0) + count
    try:
        cp = ledger.mark_prepared(
            pipeline.name,
            checkpoint_id,
            attempt=attempt,
            staging_location=path,
            records=manifest.records,
            bytes_=manifest.bytes,
            shard_counts=shard_counts,
            range_stats=range_stats,
            spark_app_id=spark.sparkContext.applicationId,
            actor=actor,
        )
    except CheckpointConflict:
        staging.remove(path)  # a losing attempt's folder is garbage
        cp = ledger.get(pipeline.name, checkpoint_id)
        return PrepareResult(
            cp,
            None,
            cp.records or 0,
            records_read,
            time.monotonic() - started,
            note=f"another attempt ({cp.prepared_attempt}) prepared it first",
        )
    return PrepareResult(cp, attempt, manifest.records, records_read, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit prepare.py --pipeline MOD:ATTR --checkpoint N [--attempt A]``."""
    parser = argparse.ArgumentParser(prog="eo-prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
    parser.add_argument("--checkpoint", type=int, required=True)
    parser.add_argument("--attempt", default=None)
    parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
    args = parser.parse_args(argv)
    from airflow_provider_eo.spark.session import get_spark

    pipeline = load_pipeline(args.pipeline)
    # Settings that came from Airflow connections (EoSubmitOperator kafka_conn_id /
    # ledger_conn_id) arrive in the environment, never on the command line.
    overrides = os.environ.get("EO_PIPELINE_OVERRIDES_JSON")
    if overrides:
        doc = json.loads(overrides)
        pipeline = dataclasses.replace(
            pipeline,
            kafka={**pipeline.kafka, **doc.get("kafka", {})},
            ledger_url=doc.get("ledger_url", pipeline.ledger_url),
        )
    actor = Actor(**json.loads(args.actor_json)) if args.actor_json else Actor.here()
    spark = get_spark(f"eo-prepare-{pipeline.name}-{args.checkpoint}", pipeline.spark_conf)
    with Ledger(pipeline.ledger_url) as ledger:
        result = prepare_checkpoint(
            spark, pipeline, ledger, args.checkpoint, attempt=args.attempt, actor=actor
        )
    print(
        json.dumps(
            {
                "pipeline": pipeline.name,
                "checkpoint": args.checkpoint,
                "state": result.checkpoint.state.value,
                "attempt": result.attempt,
                "records": result.records,
                "records_read": result.records_read,
                "note": result.note,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
