"""Shape the transform's output into staged records: columns, sink partition, size checks.

The sink partition of each record, in order of precedence:

1. an explicit ``partition`` column set by the transform;
2. the Java client's murmur2 of the key (so keys land where Java producers put them);
3. for a record with neither, a hash fixed by the input, never by how Spark ran the job:
   the source position (``xxhash64(topic, partition, offset)``) when the transform kept
   provenance, else the record's own content (``xxhash64(value, headers)``). The row's
   position after the transform (``monotonically_increasing_id``) is not used: a shuffle,
   a re-run stage or other shuffle settings change it. Two prepares of the same checkpoint
   thus put every keyless record into the same sink partition. All outputs of one source
   record share its partition (in the transform's output order); records without
   provenance that are byte-identical share one too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_eo import staging, staging_fs
from airflow_provider_eo.errors import PrepareError
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.expressions import per_jvm
from airflow_provider_eo.spark.source import PROVENANCE_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

# Bytes a record adds on the wire beyond key, value and headers (record + batch framing),
# plus our provenance headers; used for the max.message.bytes check.
RECORD_OVERHEAD_BYTES = 200

STAGED_ORDER = ("sink_partition", "src_topic", "src_partition", "src_offset", "seq")
"""Sort order inside a staged partition: source order, then the transform's output order."""


def _staged(columns: Mapping[str, Column] | None, name: str) -> Column:
    """The staged column ``name``: its expression in ``columns``, else the column by name."""
    from pyspark.sql import functions as F

    return columns[name] if columns is not None else F.col(name)


def fallback_partition(sink_partitions: int, columns: Mapping[str, Column] | None = None) -> Column:
    """The sink partition of a record with neither key nor explicit partition (see the module
    docstring): a hash of the source position, or of the content when provenance is gone.

    ``columns``: the staged columns' expressions (``src_topic``, ``src_partition``,
    ``src_offset``, ``value``, ``headers``) over the transform's output, to compute it in the
    projection that makes them; by default the staged columns themselves."""
    from pyspark.sql import functions as F

    def c(name: str) -> Column:
        return _staged(columns, name)

    by_source = F.xxhash64(c("src_topic"), c("src_partition"), c("src_offset"))
    by_content = F.xxhash64(c("value"), c("headers"))
    chosen = F.when(c("src_offset").isNotNull(), by_source).otherwise(by_content)
    return F.pmod(chosen, F.lit(sink_partitions)).cast("int")


def record_size(has_headers: bool = True, columns: Mapping[str, Column] | None = None) -> Column:
    """A staged record's size on the wire (key, value, header keys and values, and
    :data:`RECORD_OVERHEAD_BYTES`), in bytes.

    Only expressions Spark compiles into the stage's generated code: a higher-order function
    (``aggregate`` over the headers) is evaluated row by row by the interpreter and took the
    whole projection (the sink partition too) out of whole-stage code generation. A header
    array's bytes are the bytes of its keys joined plus its values joined (``array_join``
    skips null values; binary values are cast to strings byte for byte, and
    ``octet_length`` counts bytes, not characters). Without a ``headers`` column
    (``has_headers=False``) nothing is evaluated for them. ``columns``: as for
    :func:`fallback_partition` (``key``, ``value``, ``headers``).
    """
    from pyspark.sql import functions as F

    def c(name: str) -> Column:
        return _staged(columns, name)

    size = (
        F.coalesce(F.octet_length(c("value")), F.lit(0))
        + F.coalesce(F.octet_length(c("key")), F.lit(0))
        + F.lit(RECORD_OVERHEAD_BYTES)
    ).cast("long")
    if not has_headers:
        return size
    keys = F.octet_length(F.array_join(c("headers").getField("key"), ""))
    values = F.octet_length(F.array_join(c("headers").getField("value").cast("array<string>"), ""))
    return size + F.coalesce(keys, F.lit(0)).cast("long") + F.coalesce(values, F.lit(0)).cast("long")


def passed_through(out: DataFrame, source: DataFrame, name: str) -> bool:
    """Whether ``out``'s analyzed output holds ``source``'s column ``name`` itself (the same
    expression id: passed through untouched, not recomputed or aliased).

    A handful of py4j round trips whatever the number of columns: the attributes both outputs
    share are intersected in the JVM (by expression id) and only their names, as ``source``
    has them, come back: the prepare's own columns (the Kafka source's and the provenance
    column), whose names read back unambiguously. False for a DataFrame without a py4j plan."""

    def output(df: DataFrame) -> Any:
        return df._jdf.queryExecution().analyzed().outputSet()

    try:
        shared = str(output(source).intersect(output(out)).toString())
    except Exception:  # not a classic (py4j) DataFrame
        return False
    return re.search(rf"(?:^|[{{\s,]){re.escape(name)}#\d+", shared) is not None


def staged_frame(
    out: DataFrame, sink_partitions: int, where: str, source: DataFrame | None = None
) -> DataFrame:
    """Validate the transform's output and shape it into the staged columns: key, value,
    headers, src_topic/src_partition/src_offset, seq, sink_partition, size (the transform's
    ``partition`` decides ``sink_partition`` and is not kept).

    ``where`` names the pipeline and checkpoint in errors.
    """
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

    cols = set(out.columns)
    # The source's own `partition` column passed through untouched is the *source*
    # partition, not a request for a sink partition: keys are hashed like Java then.
    if "partition" in cols and source is not None and passed_through(out, source, "partition"):
        cols.discard("partition")
    if "value" not in cols:
        raise PrepareError(
            f"{where}: the transform's output has no 'value' column (columns: "
            f"{sorted(c for c in cols if not c.startswith('_eo'))}); return a DataFrame with "
            "'value' (binary or string) and optionally 'key', 'headers', 'partition'"
        )
    fields = {f.name: f.dataType for f in out.schema.fields}

    def kind(name: str) -> str:
        dtype = fields[name]
        if isinstance(dtype, (BinaryType, StringType)):
            return dtype.simpleString()
        raise PrepareError(
            f"{where}: output column {name!r} has type {dtype.simpleString()}; it must be "
            "binary or string (serialize it, e.g. F.to_json(...))"
        )

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
    form = _Form(
        value=kind("value"),
        key=kind("key") if "key" in cols else None,
        headers="headers" in cols,
        provenance=PROVENANCE_COLUMN in cols,
        partition="partition" in cols,
        sink_partitions=sink_partitions,
    )
    return out.select(*_staged_columns(out.sparkSession, form))


@dataclass(frozen=True)
class _Form:
    """What the staged columns' expressions depend on: the output's columns and types."""

    value: str
    key: str | None
    headers: bool
    provenance: bool
    partition: bool
    sink_partitions: int


_COLUMNS: dict[Hashable, tuple[Any, Any]] = {}  # expressions.per_jvm caches
_LIMITS: dict[Hashable, tuple[Any, Any]] = {}


def _staged_columns(spark: Any, form: _Form) -> list[Column]:
    """The one projection of an output of ``form`` onto the staged columns, the derived ones
    (``sink_partition``, ``size``) included, built once per JVM. One projection, not a
    projection of a projection: each DataFrame Spark builds is analyzed there and then, over
    py4j (the derived columns repeat the staged columns' expressions instead of naming them;
    Spark's generated code computes a repeated expression once)."""
    from airflow_provider_eo.spark.udfs import register_java_partitioner

    jvm_partitioner = register_java_partitioner(spark)  # per session: its function registry
    return per_jvm(
        _COLUMNS, (form, jvm_partitioner), lambda: _build_staged_columns(spark, form, jvm_partitioner)
    )


def _build_staged_columns(spark: Any, form: _Form, jvm_partitioner: bool) -> list[Column]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StringType

    from airflow_provider_eo.spark.udfs import kafka_partitioner

    def as_binary(name: str, kind: str) -> Column:
        return F.col(name) if kind == "binary" else F.col(name).cast("binary")

    key = as_binary("key", form.key) if form.key else F.lit(None).cast("binary")
    headers = F.col("headers") if form.headers else F.lit(None).cast("array<struct<key:string,value:binary>>")
    if form.provenance:
        src_topic = F.col(f"{PROVENANCE_COLUMN}.topic")
        src_partition = F.col(f"{PROVENANCE_COLUMN}.partition")
        src_offset = F.col(f"{PROVENANCE_COLUMN}.offset")
    else:  # the transform dropped provenance: order by output position instead
        src_topic = F.lit(None).cast(StringType())
        src_partition = F.lit(None).cast(IntegerType())
        src_offset = F.lit(None).cast(LongType())
    explicit = F.col("partition").cast("int") if form.partition else F.lit(None).cast("int")
    staged = {
        "key": key,
        "value": as_binary("value", form.value),
        "headers": headers,
        "src_topic": src_topic,
        "src_partition": src_partition,
        "src_offset": src_offset,
    }
    murmur = kafka_partitioner(spark, form.sink_partitions, registered=jvm_partitioner)
    sink_partition = (
        F.when(explicit.isNotNull(), explicit)
        .when(key.isNotNull(), murmur(key))
        .otherwise(fallback_partition(form.sink_partitions, staged))
    )
    return [
        *(column.alias(name) for name, column in staged.items()),
        F.monotonically_increasing_id().alias("seq"),  # ordering only, never placement
        sink_partition.alias("sink_partition"),
        record_size(has_headers=form.headers, columns=staged).alias("size"),
    ]


def bad_partition(sink_partitions: int) -> Column:
    """True for a record whose sink partition the sink topic does not have."""
    from pyspark.sql import functions as F

    return (F.col("sink_partition") < 0) | (F.col("sink_partition") >= sink_partitions)


def observe_limits(staged: DataFrame, limits: Observation, max_bytes: int, sink_partitions: int) -> DataFrame:
    """``staged`` counting, during the write, records over ``max_bytes`` (``oversize``),
    records aimed at a partition the sink lacks (``bad_partition``), every record written
    (``rows``), the records written per sink partition (``rows_p<i>``, what
    :func:`rows_per_partition` reads back) and the records without a source position
    (``created``: the transform made them, or dropped the provenance column)."""
    return staged.observe(limits, *_limit_columns(staged.sparkSession, max_bytes, sink_partitions))


def _limit_columns(spark: Any, max_bytes: int, sink_partitions: int) -> list[Column]:
    """:func:`observe_limits`' aggregates, built once per JVM and limits."""

    def build() -> list[Column]:
        from pyspark.sql import functions as F

        per_partition = [
            F.count(F.when(F.col("sink_partition") == i, 1)).alias(f"rows_p{i}")
            for i in range(sink_partitions)
        ]
        return [
            F.count(F.when(F.col("size") > max_bytes, 1)).alias("oversize"),
            F.count(F.when(bad_partition(sink_partitions), 1)).alias("bad_partition"),
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("src_offset").isNull(), 1)).alias("created"),
            *per_partition,
        ]

    return per_jvm(_LIMITS, (max_bytes, sink_partitions), build)


def rows_per_partition(seen: dict[str, Any], sink_partitions: int) -> dict[int, int]:
    """The records Spark wrote per sink partition (only partitions it wrote to), from the
    :func:`observe_limits` observation."""
    counts = {i: int(seen.get(f"rows_p{i}") or 0) for i in range(sink_partitions)}
    return {i: n for i, n in counts.items() if n}


def sources_kept(written: DataFrame) -> int:
    """Distinct source positions among the staged records (the records read minus this is
    what the transform dropped). One aggregation over the three provenance columns of the
    staged files."""
    from pyspark.sql import functions as F

    cols = ("src_topic", "src_partition", "src_offset")
    return int(written.select(*cols).where(F.col("src_offset").isNotNull()).distinct().count())


def limits_error(
    written: Callable[[], DataFrame],
    seen: dict[str, Any],
    *,
    pipeline: Pipeline,
    max_bytes: int,
    sink_partitions: int,
    where: str,
) -> PrepareError | None:
    """The error for a staged output that broke a limit (None when none did); ``seen`` is the
    :func:`observe_limits` observation, ``written`` reads the staged files back, called only
    to name an offender."""
    from pyspark.sql import functions as F

    if seen.get("oversize"):
        first = (
            written()
            .where(F.col("size") > max_bytes)
            .select("src_topic", "src_partition", "src_offset", "size")
            .first()
        )
        record = (
            f"an output record of {first['size']} bytes (from {first['src_topic']}"
            f"[{first['src_partition']}] offset {first['src_offset']})"
            if first is not None
            else "an output record"
        )
        return PrepareError(
            f"{where}: {record} exceeds the sink topic {pipeline.sink_topic!r} "
            f"max.message.bytes={max_bytes} ({seen['oversize']} record(s) do); nothing was "
            "published. Shrink the record in the transform or raise the topic's max.message.bytes."
        )
    if seen.get("bad_partition"):
        bad = written().where(bad_partition(sink_partitions)).select("sink_partition").first()
        return PrepareError(
            f"{where}: the transform set partition={bad['sink_partition'] if bad else '?'} but "
            f"{pipeline.sink_topic!r} has {sink_partitions} partitions"
        )
    return None


def refuse_over_limits(
    spark: Any,
    path: str,
    seen: dict[str, Any],
    *,
    pipeline: Pipeline,
    max_bytes: int,
    sink_partitions: int,
    where: str,
) -> None:
    """Remove the attempt folder ``path`` and raise :func:`limits_error`'s error when the
    output staged under ``{path}/data`` broke a limit; nothing when it did not."""
    refused = limits_error(
        lambda: spark.read.parquet(f"{path}/data"),
        seen,
        pipeline=pipeline,
        max_bytes=max_bytes,
        sink_partitions=sink_partitions,
        where=where,
    )
    if refused is not None:
        staging.remove(path, staging_fs.store_for(pipeline))
        raise refused
