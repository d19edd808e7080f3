"""Stage a DataFrame someone else computed: a Structured Streaming micro-batch's output.

The :class:`~airflow_provider_eo.core.prepare.Stager` of the Structured Streaming sink. It
shapes and writes the frame exactly as a pipeline's output is staged (sink partition by the
Java client's hash, record order, size limits counted during the write), but reads nothing:
the query already read its batch. Its output has no source positions, so the manifest lists
no source ranges and the audit checks these checkpoints against their staged records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_eo import staging
from airflow_provider_eo.core.prepare import StageRequest, StageResult
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import driver_stage, shape, write

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["FrameStager"]


class FrameStager:
    """Stages ``frame`` (columns ``value`` and optionally ``key``, ``headers``, ``partition``)
    for the checkpoint a :class:`StageRequest` names."""

    def __init__(self, frame: DataFrame) -> None:
        self.frame = frame

    def start(self, pipeline: Pipeline) -> None:
        """Nothing to start: the frame's session runs the write."""

    def stage(self, request: StageRequest) -> StageResult:
        """Write the frame under ``{request.path}/data`` (from the driver, :mod:`.driver_stage`,
        unless the pipeline sets ``spark_commit_min_records=0``); a failed write removes the attempt
        folder and raises Spark's error, an output over the sink's limits raises
        :func:`~airflow_provider_eo.spark.shape.limits_error`'s."""
        from pyspark.sql import Observation

        spark = self.frame.sparkSession
        where, path, sink_partitions = request.where, request.path, request.sink_partitions
        staged = shape.staged_frame(self.frame, sink_partitions, where)
        limits = Observation(f"eo-{request.pipeline.name}-{request.checkpoint_id}-{request.attempt}")
        staged = shape.observe_limits(staged, limits, request.max_message_bytes, sink_partitions)
        try:
            # A batch's size is unknown before its job: staged from the driver unless the
            # pipeline never commits there (spark_commit_min_records=0) or the rows exceed
            # spark.driver.maxResultSize (then the executors write them).
            collected = None
            if driver_stage.driver_stages(None, request.pipeline.spark_commit_min_records):
                collected = driver_stage.collect_staged(staged)
            if collected is not None:
                driver_stage.write_staged(collected, f"{path}/data", request.store)
            else:
                write.write_staged(staged, f"{path}/data", sink_partitions, source_order=False)
        except BaseException:
            staging.remove(path, request.store)
            raise
        seen = limits.get
        files = staging.describe_attempt(path, request.store)
        if files:
            shape.refuse_over_limits(
                spark,
                path,
                seen,
                pipeline=request.pipeline,
                max_bytes=request.max_message_bytes,
                sink_partitions=sink_partitions,
                where=where,
            )
        return StageResult(
            files=files,
            reads=(),
            app_id=spark.sparkContext.applicationId,
            rows_written=shape.rows_per_partition(seen, sink_partitions),
            sources_kept=None,
            created=int(seen.get("created") or 0),
        )
