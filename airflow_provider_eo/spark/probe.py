"""``eo doctor``'s staging probe: does what Spark's executors write under ``staging_dir``
reach this process? The same kind of write a prepare does (Parquet through the executors),
then the same listing the prepare and the commit do (this process's view of the folder).
Never imports Airflow."""

from __future__ import annotations

import uuid

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.pipeline import Pipeline

__all__ = ["PROBE_ROWS", "staging_probe"]

#: Rows of the probe write, spread over every task slot.
PROBE_ROWS = 1000


def staging_probe(pipeline: Pipeline, location: str) -> tuple[int, int]:
    """Write a small Parquet probe under ``location`` with the pipeline's Spark settings and
    list it from here: (rows Spark's executors wrote, rows in the files this process
    sees). The probe folder is removed as far as this process sees it (a worker's unshared
    disk keeps its part of it)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from airflow_provider_eo.spark.session import get_spark

    spark = get_spark(
        f"{names.prepare_app_name(pipeline.name)}-doctor",
        staging_fs.spark_settings(pipeline),
        env=staging_fs.jvm_environment(pipeline),
        staging_dir=location,
    )
    store = staging_fs.store_for(pipeline)
    path = f"{location.rstrip('/')}/.eo-doctor-{uuid.uuid4().hex[:12]}"
    tasks = max(2, spark.sparkContext.defaultParallelism)
    counted = Observation(f"eo-doctor-{uuid.uuid4().hex[:8]}")
    frame = spark.range(0, PROBE_ROWS, numPartitions=tasks).withColumn("sink_partition", F.lit(0))
    try:
        frame.observe(counted, F.count(F.lit(1)).alias("rows")).write.partitionBy("sink_partition").parquet(
            f"{path}/data"
        )
        written = int(counted.get.get("rows") or 0)
        seen = sum(f.records for files in staging.describe_attempt(path, store).values() for f in files)
    finally:
        staging.remove(path, store)
    return written, seen
