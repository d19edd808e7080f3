"""The Spark engine behind a prepare: read exactly a checkpoint's planned ranges, transform,
shape and write the staged files (core.prepare's :class:`~airflow_provider_eo.core.prepare.Stager`).

Each part lives in its own module: reading (:mod:`.source`), the user's transform and the
poison-record search (:mod:`.transform`), sink partitions and size checks (:mod:`.shape`)
and the Parquet write (:mod:`.write` on the executors, :mod:`.driver_stage` from the driver
for a checkpoint below ``spark_commit_min_records``). The protocol around it (ledger, manifest, commit
plan) is :func:`airflow_provider_eo.core.prepare.prepare_checkpoint`. Never imports Airflow.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.core.prepare import StageRequest, StageResult
from airflow_provider_eo.errors import PrepareError, TransformError
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import dead_letters, driver_stage, provenance, shape, source, write
from airflow_provider_eo.spark.transform import Transform, apply_transform, job_failure, load_transform

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkStager"]


class SparkStager:
    """Stages checkpoints on one SparkSession.

    :param spark: the session to use; ``None`` creates (or reuses the active) one on first
        use, with the Kafka connector on its classpath.
    :param app_name: the application name of a session created here; default
        ``eo-prepare-<pipeline>`` of the first pipeline staged.
    :param conf: Spark settings of a session created here; default the pipeline's
        ``spark_conf``.
    :param ship: more ``module:attr`` references whose modules the executors need (the
        CLI gives the pipeline's). A session created here on a cluster master ships these
        and the transform's module to the executors (``addPyFile``), as the submit operators
        do with ``py_files``; under spark-submit, ``--py-files`` is the submitter's job.
    """

    def __init__(
        self,
        spark: SparkSession | None = None,
        *,
        app_name: str | None = None,
        conf: Mapping[str, str] | None = None,
        ship: Sequence[str] = (),
    ) -> None:
        self._spark = spark
        self.app_name = app_name
        self.conf = conf
        self.ship = tuple(ship)
        self.shipped: list[str] = []  # what a session created here shipped (addPyFile)

    def session(self, pipeline: Pipeline) -> SparkSession:
        """The session, created for ``pipeline`` when there is none yet."""
        if self._spark is None:
            from airflow_provider_eo.spark.session import get_spark

            self._spark = get_spark(
                self.app_name or names.prepare_app_name(pipeline.name),
                staging_fs.spark_settings(pipeline, self.conf),
                env=staging_fs.jvm_environment(pipeline),
                staging_dir=pipeline.staging_dir,
            )
            self._ship_user_code(self._spark, pipeline)
        return self._spark

    def _ship_user_code(self, spark: SparkSession, pipeline: Pipeline) -> None:
        """On a cluster master (and not under spark-submit), add the user's modules (the
        transform's, :attr:`ship`) to the session: a Python UDF is pickled by reference to
        its module, which the executors must import."""
        import os
        import sys

        from airflow_provider_eo.spark.session import is_local_master
        from airflow_provider_eo.spark.shipping import ship_py_files

        if os.environ.get("PYSPARK_GATEWAY_PORT") or is_local_master(str(spark.sparkContext.master)):
            return
        for path in ship_py_files([*self.ship, pipeline.transform]):
            spark.sparkContext.addPyFile(path)
            self.shipped.append(path)
        if self.shipped:
            print(
                f"eo: shipping to the executors (addPyFile): {', '.join(self.shipped)}",
                file=sys.stderr,
                flush=True,
            )

    def start(self, pipeline: Pipeline) -> None:
        """Create the session now (a stream does so before it installs its signal handlers:
        PySpark installs its own SIGINT handler)."""
        self.session(pipeline)

    def stage(self, request: StageRequest) -> StageResult:
        """Read ``request.ranges``, run the pipeline's transform, write the staged Parquet
        under ``{request.path}/data``; per-range counts and timestamps and the size limits
        are observed during that one write (the source is read once).

        A failed job removes the attempt folder and raises
        :func:`~airflow_provider_eo.spark.transform.job_failure`'s error; a record over the
        sink's ``max.message.bytes`` or aimed at a partition it lacks removes it and raises
        :func:`~airflow_provider_eo.spark.shape.limits_error`'s. With dead letters enabled, a
        source record the transform fails on (or whose output is over the limit) is left
        out of the next write instead, up to the pipeline's budget, and written with its
        error under ``{request.path}/dead`` (:mod:`.dead_letters`).
        """
        pipeline = request.pipeline
        spark = self.session(pipeline)
        name = f"eo-{pipeline.name}-{request.checkpoint_id}-{request.attempt}"
        where, path = request.where, request.path
        transform = load_transform(pipeline.transform)
        exclude: dict[dead_letters.Position, str] = {}  # this checkpoint's dead letters
        outcome: StageResult | None = None
        try:
            for round_ in itertools.count():
                written = self._write(request, transform, exclude, f"{name}-{round_}" if round_ else name)
                if isinstance(written, StageResult):
                    outcome = written
                    break
                # Dead letters found: the next round leaves them out (its own data folder).
                before = len(exclude)
                dead_letters.admit(exclude, written, pipeline, where)
                if len(exclude) == before:  # never loop on a record already left out
                    raise TransformError(
                        f"{where}: the transform still fails with its dead letters left out "
                        f"({', '.join(f'{t}[{p}] offset {o}' for t, p, o in sorted(written))}); "
                        "it does not fail on one record. Nothing was published; fix the "
                        "transform and retry the prepare."
                    )
                staging.remove(f"{path}/data", request.store)
            assert outcome is not None
            if not exclude:
                return outcome
            count = dead_letters.write_dead_letters(spark, pipeline, exclude, path, name)
            if count != len(exclude):
                raise PrepareError(
                    f"{where}: {len(exclude)} dead letters were found but {count} could be read "
                    "back from the source (deleted by retention meanwhile?). Nothing was "
                    "published; retry the prepare."
                )
        except BaseException:
            staging.remove(path, request.store)
            raise
        return dataclasses.replace(
            outcome,
            dead_letters=tuple(staging.describe_dead_letters(path, request.store)),
            dead_letters_written=count,
        )

    def _write(
        self,
        request: StageRequest,
        transform: Transform,
        exclude: dict[dead_letters.Position, str],
        name: str,
    ) -> StageResult | dict[dead_letters.Position, str]:
        """One write of the checkpoint's output without the ``exclude`` records: the
        :class:`StageResult`, or the source records that must become dead letters first (a
        record the transform fails on, outputs over the sink's limit)."""
        from pyspark.sql import Observation

        pipeline = request.pipeline
        spark = self.session(pipeline)
        where, path, sink_partitions = request.where, request.path, request.sink_partitions
        ranges = list(request.ranges)
        live = source.live_ranges(ranges)

        # 1. Bounded read of exactly the planned ranges (a checkpoint staged by the driver may
        #    be read by it too); per-range counts and timestamps are observed during the
        #    write (no second read), dead letters included.
        bound = sum(r.end - r.start for r in live)  # offsets, not records: an upper bound
        small = driver_stage.driver_stages(bound, pipeline.spark_commit_min_records)
        frame = source.read_ranges(
            spark, pipeline, ranges, time_filter=request.time_filter, driver_read=small
        )
        observation = Observation(name)
        metrics = source.range_metrics(live)
        if metrics:
            frame = frame.observe(observation, *metrics)
        frame = source.with_provenance(source.without_positions(frame, exclude))

        # 2. The user's transform.
        out = apply_transform(transform, frame, ref=pipeline.transform, where=where)
        # The source position, carried through a transform that did not keep it (a select
        # of key and value) wherever its operators keep rows (not an aggregation's).
        out = provenance.carry_provenance(out, frame)

        # 3. Shape: columns, sink partition, limits counted during the write.
        staged = shape.staged_frame(out, sink_partitions, where, frame)
        limits = Observation(f"{name}-limits")
        staged = shape.observe_limits(staged, limits, request.max_message_bytes, sink_partitions)

        # 4. Write the staged files under the fresh attempt folder: from the driver when the
        #    checkpoint is small enough for the commit to run here too (its rows collected as
        #    Arrow by this one job), else by the executors.
        collected = None
        try:
            if small:
                collected = driver_stage.collect_staged(staged)
            if collected is not None:
                driver_stage.write_staged(collected, f"{path}/data", request.store)
            else:
                write.write_staged(staged, f"{path}/data", sink_partitions, source_tasks=len(live))
        except Exception as exc:
            search: dict[str, Any] = {
                "spark": spark,
                "pipeline": pipeline,
                "transform": transform,
                "live": live,
                "exclude": exclude,
                "time_filter": request.time_filter,
            }
            found = dead_letters.failing_record(exc, **search)
            if found is not None:
                return dict([found])
            staging.remove(path, request.store)
            raise job_failure(exc, where=where, **search) from exc
        # The counts Spark took while writing, whatever this process can list: a staging
        # folder the driver does not share lists nothing, and core.prepare refuses that.
        seen = limits.get
        files = staging.describe_attempt(path, request.store)
        sources_kept: int | None = 0
        if files:
            if seen.get("oversize") and pipeline.dead_letters_enabled:
                written = spark.read.parquet(f"{path}/data")
                oversize = dead_letters.oversize_records(written, request.max_message_bytes)
                if oversize:
                    return oversize
            shape.refuse_over_limits(
                spark,
                path,
                seen,
                pipeline=pipeline,
                max_bytes=request.max_message_bytes,
                sink_partitions=sink_partitions,
                where=where,
            )
            created = int(seen.get("created") or 0)
            total = int(seen.get("rows") or 0)
            # Which source records the output still names (the rest the transform dropped):
            # one aggregation over the staged provenance columns, skipped when no record has one.
            # Up to spark_commit_min_records records (where the commit, too, runs here) it is
            # read here with Arrow: a Spark job for it cost 0.3-0.4 s of a 125k-record prepare.
            if total <= created:
                sources_kept = 0
            elif collected is not None:
                sources_kept = driver_stage.source_positions(collected)
            elif total <= pipeline.spark_commit_min_records:
                sources_kept = staging.source_positions(path, files, request.store)
            else:
                sources_kept = shape.sources_kept(spark.read.parquet(f"{path}/data"))
        return StageResult(
            files=files,
            reads=tuple(source.range_reads(live, observation.get if metrics else {})),
            app_id=spark.sparkContext.applicationId,
            rows_written=shape.rows_per_partition(seen, sink_partitions),
            sources_kept=sources_kept,
            created=int(seen.get("created") or 0),
        )
