"""Stage a small checkpoint from the driver: the shaped output collected as Arrow by the
checkpoint's one Spark job, sorted and written here as the staged Parquet files.

A checkpoint the driver commits anyway (fewer records than the pipeline's
``spark_commit_min_records``) pays a Parquet write job for little: its planning, task
scheduling and file committer cost more than the records. Here the same shaped frame (the
same observations: per-range counts and timestamps, the size and partition limits) is
collected with :meth:`DataFrame.toArrow` and written by this process in the layout
:mod:`.write` leaves (``data/sink_partition=P/*.parquet``, rows in
:data:`~airflow_provider_eo.spark.shape.STAGED_ORDER`, no ``sink_partition`` column in the
files), so the listing, the checks, the manifest and the commit see what they see after an
executor write. The files stay the source of truth: nothing is published from memory.

A collect larger than ``spark.driver.maxResultSize`` fails in Spark before it reaches this
process; :func:`collect_staged` answers ``None`` then and the caller writes on the executors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_eo.spark.shape import STAGED_ORDER
from airflow_provider_eo.spark.write import PARQUET_ROW_GROUP_BYTES
from airflow_provider_eo.staging import PROVENANCE_COLUMNS
from airflow_provider_eo.staging_fs import StagingStore, with_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["STAGED_FILE", "collect_staged", "driver_stages", "source_positions", "write_staged"]

#: The one file a driver-staged sink partition holds (Spark's names sort the same way).
STAGED_FILE = "part-00000-driver.snappy.parquet"

# Spark's error when a collect's task results exceed spark.driver.maxResultSize.
_RESULT_TOO_LARGE = "spark.driver.maxResultSize"


def driver_stages(records_bound: int | None, min_records: int) -> bool:
    """Whether a checkpoint is staged from the driver: its records (at most
    ``records_bound``; ``None`` when unknown, a Structured Streaming batch's) stay below
    ``min_records`` (the pipeline's ``spark_commit_min_records``), where the commit, too,
    runs in this process."""
    if min_records <= 0:
        return False
    return records_bound is None or records_bound < min_records


def collect_staged(staged: DataFrame) -> pa.Table | None:
    """Run ``staged``'s job (its observations fire as they do for a write) and return its
    rows as one Arrow table; ``None`` when the rows exceed ``spark.driver.maxResultSize``
    (nothing reached this process; stage on the executors instead). Any other failure of
    the job is raised as Spark raised it, for the caller's dead-letter and error handling."""
    try:
        return staged.toArrow()
    except Exception as exc:
        if _RESULT_TOO_LARGE in str(exc):
            return None
        raise


def _sorted(table: pa.Table) -> pa.Table:
    """``table`` in :data:`STAGED_ORDER`, nulls first as Spark's ascending sort puts them: each
    column is preceded by whether it is set (false first), which needs no null placement
    (whose spelling differs between pyarrow versions)."""
    keys: list[tuple[str, str]] = []
    indexed = table
    for name in STAGED_ORDER:
        flag = f"_eo_set_{name}"
        indexed = indexed.append_column(flag, pc.is_valid(table.column(name)))
        keys += [(flag, "ascending"), (name, "ascending")]
    return table.take(pc.sort_indices(indexed, sort_keys=keys))


def write_staged(table: pa.Table, data_dir: str, store: StagingStore | None = None) -> dict[int, int]:
    """Write ``table`` (:func:`collect_staged`'s rows) under ``data_dir`` as
    ``sink_partition=P/``:data:`STAGED_FILE`, one file per sink partition with rows, sorted
    as the executor write sorts them, with its Parquet settings (Snappy, no dictionary,
    row groups of about :data:`~airflow_provider_eo.spark.write.PARQUET_ROW_GROUP_BYTES`).
    Returns the rows written per sink partition."""
    fs, root = with_store(store).open(data_dir)
    # The folder exists even for no rows, as after a Spark write: the manifest goes beside it.
    fs.create_dir(root, recursive=True)
    table = _sorted(table)
    partitions = table.column("sink_partition")
    rows_per_group = max(1, (PARQUET_ROW_GROUP_BYTES * table.num_rows) // max(1, table.nbytes))
    written: dict[int, int] = {}
    if table.num_rows:
        # Sorted by sink partition first: each partition is one slice of the table.
        values, counts = pc.value_counts(partitions).flatten()
        bounds = sorted(zip(values.to_pylist(), counts.to_pylist(), strict=True))
        data = table.drop_columns(["sink_partition"])
        offset = 0
        for partition, count in bounds:
            folder = f"{root}/sink_partition={partition}"
            fs.create_dir(folder, recursive=True)
            pq.write_table(
                data.slice(offset, count),
                f"{folder}/{STAGED_FILE}",
                filesystem=fs,
                compression="snappy",
                use_dictionary=False,
                row_group_size=rows_per_group,
            )
            written[int(partition)] = int(count)
            offset += count
    return written


def source_positions(table: pa.Table) -> int:
    """Distinct source positions (topic, partition, offset) among ``table``'s rows, records
    without a position left out: what
    :func:`airflow_provider_eo.staging.source_positions` reads back from the files."""
    positions = table.select(list(PROVENANCE_COLUMNS))
    positions = positions.filter(positions.column("src_offset").is_valid())
    return int(positions.group_by(list(PROVENANCE_COLUMNS)).aggregate([]).num_rows)
