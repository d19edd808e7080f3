"""Prepare one checkpoint with PySpark: read exactly its planned ranges, transform, stage.

Runnable by ``spark-submit`` (``spark-submit .../prepare.py --pipeline mod:ATTR --checkpoint N``)
or in-process from ``eo prepare``. Never imports Airflow.

:func:`prepare_checkpoint` is the protocol's prepare step; each part lives in its own module:
reading (:mod:`.source`), the user's transform and the poison-record search
(:mod:`.transform`), sink partitions and size checks (:mod:`.shape`), the Parquet write
(:mod:`.write`), and the manifest (:mod:`airflow_provider_eo.staging`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.plan import data_loss_error, frozen_commit_plan, lost_ranges
from airflow_provider_eo.errors import PrepareError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointConflict,
    CheckpointRecord,
    CheckpointState,
    Ledger,
)
from airflow_provider_eo.pipeline import Pipeline, load_pipeline
from airflow_provider_eo.spark import shape, source, write
from airflow_provider_eo.spark.transform import apply_transform, job_failure, load_transform

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PrepareResult", "apply_overrides", "load_transform", "main", "prepare_checkpoint"]


@dataclass(frozen=True)
class PrepareResult:
    """What one prepare call did."""

    checkpoint: CheckpointRecord
    attempt: str | None  # None when nothing had to be done
    records: int
    records_read: int
    seconds: float
    note: str = ""


def new_attempt() -> str:
    """A fresh attempt name: sortable by start time, unique across racing attempts."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


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
    its own folder. Each step is safe to repeat after a crash: a new attempt writes a new
    folder, and a folder without a manifest is never published.
    """
    from pyspark.sql import Observation

    started = time.monotonic()
    where = f"pipeline {pipeline.name!r}, checkpoint {checkpoint_id}"
    # 1. The planned range, from the ledger. PREPARED/COMMITTED: nothing to do; ABORTED: refuse.
    cp = ledger.get(pipeline.name, checkpoint_id)
    if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
        return PrepareResult(cp, None, cp.records or 0, 0, 0.0, note=f"already {cp.state.value}")
    if cp.state is not CheckpointState.PLANNED:
        raise PrepareError(
            f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}; only "
            "PLANNED checkpoints can be prepared (an aborted range is replanned by the next plan)"
        )
    config = librdkafka_config(pipeline.kafka)
    # The output is partitioned for the checkpoint's frozen commit plan, never the sink's
    # live partition count (a checkpoint from before ledger revision 0002 freezes it now).
    commit_plan = frozen_commit_plan(pipeline, ledger, cp, actor=actor)
    sink_partitions = commit_plan.sink_partitions
    admin.partitions_of(config, pipeline.source_topics)  # a deleted source is a clear error
    # Offsets retention (or a topic re-creation) took away fail every retry the same way:
    # name the lost ranges and what to do instead of a Spark OffsetOutOfRange.
    lost = lost_ranges(pipeline, list(cp.ranges))
    if lost:
        raise data_loss_error(pipeline, cp, lost)
    max_bytes = shape.sink_max_message_bytes(pipeline)
    attempt = attempt or new_attempt()
    path = names.attempt_dir(pipeline, checkpoint_id, attempt)
    live = source.live_ranges(list(cp.ranges))

    # 2. Bounded read of exactly the planned ranges; per-range counts and timestamps are
    #    observed during the write (no second read).
    frame = source.read_ranges(spark, pipeline, list(cp.ranges), time_filter=cp.time_filter)
    observation = Observation(f"eo-{pipeline.name}-{checkpoint_id}-{attempt}")
    metrics = source.range_metrics(live)
    if metrics:
        frame = frame.observe(observation, *metrics)
    frame = source.with_provenance(frame)

    # 3. The user's transform.
    transform = load_transform(pipeline.transform)
    out = apply_transform(transform, frame, ref=pipeline.transform, where=where)

    # 4. Shape: columns, sink partition, limits counted during the write.
    staged = shape.staged_frame(out, sink_partitions, where, frame)
    limits = Observation(f"eo-{pipeline.name}-{checkpoint_id}-{attempt}-limits")
    staged = shape.observe_limits(staged, limits, max_bytes, sink_partitions)

    # 5. Write the staged files under the fresh attempt folder.
    try:
        write.write_staged(staged, f"{path}/data", sink_partitions)
    except Exception as exc:
        staging.remove(path)
        raise job_failure(
            exc, spark=spark, pipeline=pipeline, transform=transform, live=live, where=where
        ) from exc
    fault_point("prepare.after_write")
    files = staging.describe_attempt(path)
    if files:
        refused = shape.limits_error(
            lambda: spark.read.parquet(f"{path}/data"),
            limits.get,
            pipeline=pipeline,
            max_bytes=max_bytes,
            sink_partitions=sink_partitions,
            where=where,
        )
        if refused is not None:
            staging.remove(path)
            raise refused

    # 6. The manifest, last: its presence means the staged output is complete.
    records_read, manifest_ranges, range_stats = source.range_summary(
        live, observation.get if metrics else {}
    )
    manifest = staging.Manifest(
        pipeline=pipeline.name,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        sink_topic=commit_plan.sink_topic,
        sink_partitions=sink_partitions,
        files=files,
        records_read=records_read,
        ranges=manifest_ranges,
    )
    staging.write_manifest(path, manifest)
    fault_point("prepare.before_ledger")

    # 7. PLANNED -> PREPARED naming this attempt; a losing attempt's folder is garbage.
    shard_counts: dict[int, int] = {}
    for partition, count in manifest.partition_counts().items():
        shard = commit_plan.shard_of_partition[partition]
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
        staging.remove(path)
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


def apply_overrides(pipeline: Pipeline, overrides: str | None) -> Pipeline:
    """``pipeline`` with the settings that came from Airflow connections (the JSON the submit
    operator puts in :data:`names.PIPELINE_OVERRIDES_ENV`: ``kafka`` merged over the
    pipeline's, ``ledger_url`` replacing it); unchanged when ``overrides`` is empty."""
    if not overrides:
        return pipeline
    doc = json.loads(overrides)
    return dataclasses.replace(
        pipeline,
        kafka={**pipeline.kafka, **doc.get("kafka", {})},
        ledger_url=doc.get("ledger_url", pipeline.ledger_url),
    )


def main(argv: list[str] | None = None) -> int:
    """``spark-submit prepare.py --pipeline MOD:ATTR --checkpoint N [--attempt A]``; with
    ``--backfill-sink-topic TOPIC [--backfill-transform MOD:FN]`` the checkpoint is one of
    the pipeline's backfill into TOPIC (core/backfill.py)."""
    parser = argparse.ArgumentParser(prog=names.PREPARE_APP, description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
    parser.add_argument("--checkpoint", type=int, required=True)
    parser.add_argument("--attempt", default=None)
    parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
    parser.add_argument(
        "--backfill-sink-topic", default=None, help="prepare a checkpoint of the backfill into TOPIC"
    )
    parser.add_argument(
        "--backfill-transform", default=None, help="the backfill's transform MOD:FN (default: the pipeline's)"
    )
    args = parser.parse_args(argv)
    if args.backfill_transform and not args.backfill_sink_topic:
        parser.error("--backfill-transform needs --backfill-sink-topic")
    from airflow_provider_eo.spark.session import get_spark

    # Settings that came from Airflow connections (EoSubmitOperator kafka_conn_id /
    # ledger_conn_id) arrive in the environment, never on the command line.
    pipeline = apply_overrides(load_pipeline(args.pipeline), os.environ.get(names.PIPELINE_OVERRIDES_ENV))
    if args.backfill_sink_topic:
        from airflow_provider_eo.core.backfill import backfill_pipeline

        # The backfill's plan already refused the live sink unless it was allowed: a
        # checkpoint of that backfill exists only then.
        pipeline = backfill_pipeline(
            pipeline,
            args.backfill_sink_topic,
            transform=args.backfill_transform,
            allow_live_sink=True,
        )
    actor = Actor(**json.loads(args.actor_json)) if args.actor_json else Actor.here()
    spark = get_spark(names.prepare_app_name(pipeline.name, args.checkpoint), pipeline.spark_conf)
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
