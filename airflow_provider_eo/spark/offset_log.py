"""A Structured Streaming query's checkpoint location, read the way Spark wrote it: the
query's id (``metadata``), and a micro-batch's Kafka offset ranges (``offsets/<batch>``, the
previous batch's entry or the Kafka source's initial offsets ``sources/<i>/0``).

Spark writes ``offsets/N`` before it runs batch N and never changes it, so a re-run of N
reads the same ranges. The log's format is Spark's checkpoint format (``v1``: a version
line, a metadata line, then one line per source, ``-`` for a source without an offset);
files are read through Hadoop's FileSystem of the session, so any location Spark accepts
(HDFS, S3, GCS, a local folder) works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.errors import OffsetLogError as OffsetLogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "BatchOffsets",
    "OffsetLogError",
    "batch_offsets",
    "kafka_offsets",
    "parse_offset_log",
    "parse_source_initial",
    "query_id",
]

TP = tuple[str, int]


@dataclass(frozen=True)
class BatchOffsets:
    """One micro-batch's Kafka ranges: ``starts`` (None for a partition the query found in
    this batch: Spark reads it from its earliest offset) and ``ends``, per topic-partition."""

    starts: dict[TP, int | None]
    ends: dict[TP, int]


def parse_offset_log(text: str, *, where: str) -> list[str | None]:
    """The per-source entries of one offset-log file (JSON text, None for ``-``)."""
    lines = text.lstrip("\x00").split("\n")
    if not lines or lines[0].strip() != "v1":
        raise OffsetLogError(
            f"{where}: offset log version {lines[0].strip()[:20]!r} is not supported (this version "
            "of airflow-provider-eo reads Spark's 'v1' offset log)"
        )
    entries = [line.strip() for line in lines[2:]]
    while entries and not entries[-1]:
        entries.pop()
    return [None if e in ("-", "") else e for e in entries]


def parse_source_initial(text: str) -> str:
    """The JSON of a source's initial offsets file (``sources/<i>/0``: an optional NUL byte,
    ``v1``, then the offsets)."""
    body = text.lstrip("\x00")
    first, _, rest = body.partition("\n")
    return rest.strip() if first.strip().startswith("v") else body.strip()


def kafka_offsets(entry: str | None) -> dict[TP, int] | None:
    """``{(topic, partition): offset}`` of a Kafka source's JSON (``{"t": {"0": 12}}``), or
    None when the entry is not a Kafka source's."""
    if entry is None:
        return None
    try:
        doc: Any = json.loads(entry)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not doc:
        return None
    out: dict[TP, int] = {}
    for topic, partitions in doc.items():
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            if not isinstance(offset, int) or not str(partition).lstrip("-").isdigit():
                return None
            out[(str(topic), int(partition))] = offset
    return out


def _read(spark: SparkSession, path: str) -> str | None:
    """A small file's text through the session's Hadoop FileSystem, None when missing."""
    jvm: Any = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM here; the server reads the file
        return _read_remote(spark, path)
    conf = spark._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(conf)
    if not fs.exists(hpath):
        return None
    stream = fs.open(hpath)
    try:
        data = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()
    return data.decode("utf-8")


def _read_remote(spark: SparkSession, path: str) -> str | None:
    from pyspark.errors import AnalysisException

    try:
        rows = spark.read.text(path, wholetext=True).collect()
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return None
        raise
    return str(rows[0][0]) if rows else ""


def query_id(spark: SparkSession, checkpoint_location: str) -> str:
    """The query's id, from ``<checkpoint_location>/metadata`` (written when the query first
    started; it survives restarts from the same location)."""
    text = _read(spark, f"{checkpoint_location.rstrip('/')}/metadata")
    if text is None:
        raise OffsetLogError(
            f"checkpoint location {checkpoint_location!r} has no 'metadata' file: is it the "
            "location this query was started with?"
        )
    ident = json.loads(text.strip().splitlines()[0]).get("id")
    if not ident:
        raise OffsetLogError(f"checkpoint location {checkpoint_location!r}: 'metadata' names no query id")
    return str(ident)


def batch_offsets(
    spark: SparkSession, checkpoint_location: str, batch_id: int, *, where: str
) -> BatchOffsets:
    """Batch ``batch_id``'s Kafka ranges, from the query's offset log."""
    root = checkpoint_location.rstrip("/")
    text = _read(spark, f"{root}/offsets/{batch_id}")
    if text is None:
        raise OffsetLogError(
            f"{where}: {root}/offsets/{batch_id} does not exist; the sink must be used through "
            "KafkaExactlyOnceSink.start (or given the query's checkpoint location)"
        )
    ends_per_source = parse_offset_log(text, where=where)
    previous: list[str | None] | None = None
    if batch_id > 0:
        prev_text = _read(spark, f"{root}/offsets/{batch_id - 1}")
        if prev_text is None:
            raise OffsetLogError(
                f"{where}: {root}/offsets/{batch_id - 1} (the previous batch's end) is missing; "
                "the sink cannot tell where this batch starts"
            )
        previous = parse_offset_log(prev_text, where=where)
    starts: dict[TP, int | None] = {}
    ends: dict[TP, int] = {}
    for index, entry in enumerate(ends_per_source):
        source_ends = kafka_offsets(entry)
        if source_ends is None:
            continue  # not a Kafka source (a file or rate source): nothing to record
        if previous is not None and index < len(previous):
            source_starts = kafka_offsets(previous[index]) or {}
        else:
            initial = _read(spark, f"{root}/sources/{index}/0")
            found = kafka_offsets(parse_source_initial(initial)) if initial else None
            if found is None:
                raise OffsetLogError(
                    f"{where}: source {index}'s initial offsets ({root}/sources/{index}/0) are missing "
                    "or not a Kafka source's"
                )
            source_starts = found
        for tp, end in source_ends.items():
            if tp in ends:
                raise OffsetLogError(
                    f"{where}: {tp[0]}[{tp[1]}] is read by two sources of the query; read each "
                    "topic through one Kafka source"
                )
            ends[tp] = end
            starts[tp] = source_starts.get(tp)
    return BatchOffsets(starts=starts, ends=ends)
