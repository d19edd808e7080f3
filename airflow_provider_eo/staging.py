"""The staging area: attempt folders of Parquet files and the manifest written last.

Paths are local folders or URIs, opened through :mod:`airflow_provider_eo.staging_fs` (the
one filesystem layer: ``s3a://``/``s3://``, ``gs://``, ``abfss://``, ``hdfs://``). Every function
takes the pipeline's :class:`~airflow_provider_eo.staging_fs.StagingStore` (``store``, from
:func:`~airflow_provider_eo.staging_fs.store_for`); without one, S3 settings come from this
process's AWS environment only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_eo.errors import StagingError, StagingNotVisible, StagingUnreadable
from airflow_provider_eo.names import DEAD_LETTERS_DIR, MANIFEST
from airflow_provider_eo.staging_fs import StagingStore, with_store

MANIFEST_VERSION = 1


def resolve_location(staging_dir: str) -> tuple[str, bool]:
    """``staging_dir`` as an absolute location (a URI is taken as it is, a local path made
    absolute against this working folder) and whether it was relative."""
    if "://" in staging_dir:
        return staging_dir.rstrip("/"), False
    import os

    return os.path.abspath(staging_dir), not os.path.isabs(staging_dir)


def _fs(path: str, store: StagingStore | None = None) -> tuple[pafs.FileSystem, str]:
    return with_store(store).open(path)


def check_reachable(pipeline: str, location: str, store: StagingStore | None = None) -> None:
    """Fail early, naming the staging location and where its credentials came from, when
    this process cannot list it (wrong credentials, unknown bucket, endpoint down): a
    :class:`StagingUnreadable`, nothing staged, nothing published. A local folder is
    created on first use, so only URIs are checked."""
    if "://" not in location:
        return
    store = with_store(store)
    try:
        fs, root = store.open(location)
        fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError as exc:
        bucket = location.split("://", 1)[1].split("/", 1)[0]
        raise StagingUnreadable(
            f"pipeline {pipeline!r}: staging_dir {location!r} cannot be listed from this process "
            f"({store.s3_for(bucket).describe()}): {exc}. Nothing was staged or published; fix "
            "the staging credentials or endpoint (Pipeline.spark_conf's spark.hadoop.fs.s3a.*, "
            "the AWS_* environment or aws_conn_id, in that order; docs/object-storage.md) and retry."
        ) from exc


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file of a sink partition."""

    path: str  # relative to the attempt folder
    records: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a prepare attempt staged: per sink partition, its files, counts and checksums."""

    pipeline: str
    checkpoint_id: int
    attempt: str
    sink_topic: str
    sink_partitions: int
    files: dict[int, list[StagedFile]]  # sink partition -> files in publish order
    records_read: int
    ranges: list[dict[str, Any]]
    #: Read records no output record names (the transform dropped them); None: not counted.
    dropped: int | None = None
    #: Output records without a source position (the transform made them).
    created: int = 0
    #: The ledger identity of the pipeline that staged it (None: written before manifests
    #: named it). Cleanup removes only its own ledger's attempts.
    identity: str | None = None
    #: Source records sent to the dead-letter topic, as Parquet files (``dead/*.parquet``);
    #: the commit's shard that moves the consumer group publishes them in its transaction.
    dead_letters: list[StagedFile] = field(default_factory=list)
    #: The topic they go to (frozen here: a later settings change does not move them).
    dead_letter_topic: str | None = None

    @property
    def dead_letter_count(self) -> int:
        """Source records staged for the dead-letter topic."""
        return sum(f.records for f in self.dead_letters)

    @property
    def records(self) -> int:
        """Output records staged (what the commit publishes)."""
        return sum(f.records for fs in self.files.values() for f in fs)

    @property
    def bytes(self) -> int:
        """Bytes of staged Parquet."""
        return sum(f.bytes for fs in self.files.values() for f in fs)

    def partition_counts(self) -> dict[int, int]:
        """Output records per sink partition."""
        return {p: sum(f.records for f in fs) for p, fs in self.files.items()}

    def to_json(self) -> str:
        """The manifest file's content."""
        return json.dumps(
            {
                "version": MANIFEST_VERSION,
                "pipeline": self.pipeline,
                "checkpoint_id": self.checkpoint_id,
                "attempt": self.attempt,
                "sink_topic": self.sink_topic,
                "sink_partitions": self.sink_partitions,
                "records_read": self.records_read,
                "ranges": self.ranges,
                "dropped": self.dropped,
                "created": self.created,
                "identity": self.identity,
                "dead_letters": [f.__dict__ for f in self.dead_letters],
                "dead_letter_topic": self.dead_letter_topic,
                "files": {str(p): [f.__dict__ for f in fs] for p, fs in sorted(self.files.items())},
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest file's content."""
        doc = json.loads(text)
        return cls(
            pipeline=doc["pipeline"],
            checkpoint_id=int(doc["checkpoint_id"]),
            attempt=doc["attempt"],
            sink_topic=doc["sink_topic"],
            sink_partitions=int(doc["sink_partitions"]),
            files={int(p): [StagedFile(**f) for f in fs] for p, fs in doc["files"].items()},
            records_read=int(doc["records_read"]),
            ranges=list(doc["ranges"]),
            dropped=None if doc.get("dropped") is None else int(doc["dropped"]),
            created=int(doc.get("created") or 0),
            identity=doc.get("identity"),
            dead_letters=[StagedFile(**f) for f in doc.get("dead_letters") or []],
            dead_letter_topic=doc.get("dead_letter_topic"),
        )


def sha256_of(fs: pafs.FileSystem, path: str) -> str:
    """Streaming SHA-256 of a file."""
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def describe_attempt(attempt_path: str, store: StagingStore | None = None) -> dict[int, list[StagedFile]]:
    """List the Parquet files Spark wrote (``data/sink_partition=P/*.parquet``) with counts,
    sizes and checksums, in publish order."""
    fs, root = _fs(attempt_path, store)
    data = f"{root}/data"
    out: dict[int, list[StagedFile]] = {}
    infos = fs.get_file_info(pafs.FileSelector(data, recursive=True, allow_not_found=True))
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        rel = info.path[len(root) + 1 :]
        part_dir = rel.split("/")[1]
        partition = int(part_dir.split("=", 1)[1])
        records = pq.ParquetFile(fs.open_input_file(info.path)).metadata.num_rows
        out.setdefault(partition, []).append(
            StagedFile(path=rel, records=records, bytes=info.size, sha256=sha256_of(fs, info.path))
        )
    return out


def describe_dead_letters(attempt_path: str, store: StagingStore | None = None) -> list[StagedFile]:
    """List the dead-letter Parquet files of an attempt (``dead/*.parquet``) with counts,
    sizes and checksums, in publish order (empty when there are none)."""
    fs, root = _fs(attempt_path, store)
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{DEAD_LETTERS_DIR}", allow_not_found=True))
    out = []
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        records = pq.ParquetFile(fs.open_input_file(info.path)).metadata.num_rows
        rel = info.path[len(root) + 1 :]
        out.append(StagedFile(path=rel, records=records, bytes=info.size, sha256=sha256_of(fs, info.path)))
    return out


def write_manifest(attempt_path: str, manifest: Manifest, store: StagingStore | None = None) -> None:
    """Write the manifest last (temp name, then rename where the filesystem supports it)."""
    fs, root = _fs(attempt_path, store)
    tmp = f"{root}/{MANIFEST}.tmp"
    with fs.open_output_stream(tmp) as out:
        out.write(manifest.to_json().encode())
    fs.move(tmp, f"{root}/{MANIFEST}")


def read_manifest(attempt_path: str, store: StagingStore | None = None) -> Manifest:
    """Read an attempt's manifest.

    An unparsable manifest is a :class:`StagingError` (corrupt: the checkpoint must be
    aborted); a missing one is :class:`StagingNotVisible` (absent here is not corrupt: the
    output may be intact where it was written; retry, abort nothing); any other I/O error
    is :class:`StagingUnreadable` (the storage did not answer: retry, abort nothing).
    """
    fs, root = _fs(attempt_path, store)
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as stream:
            text = stream.read().decode()
    except FileNotFoundError as exc:
        import socket

        raise StagingNotVisible(
            f"the manifest of {attempt_path} is not visible from this process (host "
            f"{socket.gethostname()}, looked at {root}/{MANIFEST}). The staged output may be "
            "intact where it was written: nothing was published and nothing aborted. Run the "
            "commit where the staging location is visible (staging_dir must be shared by the "
            "Spark driver, the executors and the committer); if the staged output is really "
            "gone, abort the checkpoint with `eo abort` (its range is replanned)."
        ) from exc
    except OSError as exc:
        raise StagingUnreadable(
            f"the manifest of {attempt_path} could not be read: {exc}. Nothing was published "
            "and nothing aborted; retry the commit once the storage answers."
        ) from exc
    try:
        return Manifest.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise StagingError(f"the manifest of {attempt_path} is corrupt: {exc!r}") from exc


def verify(attempt_path: str, manifest: Manifest, store: StagingStore | None = None) -> None:
    """Check every staged file against the manifest (exists, size, SHA-256, row count).

    A verified mismatch (file missing, size or checksum differs) is a :class:`StagingError`;
    an I/O error while checking is :class:`StagingUnreadable` (nothing is decided).
    """
    fs, root = _fs(attempt_path, store)
    groups: list[tuple[int | str, list[StagedFile]]] = list(manifest.files.items())
    if manifest.dead_letters:
        groups.append(("dead letters", manifest.dead_letters))
    for partition, files in groups:
        label = f"sink partition {partition}" if isinstance(partition, int) else str(partition)
        for f in files:
            full = f"{root}/{f.path}"
            try:
                info = fs.get_file_info(full)
                if info.type != pafs.FileType.File:
                    raise StagingError(
                        f"checkpoint {manifest.checkpoint_id} of pipeline {manifest.pipeline!r}: "
                        f"staged file {f.path} ({label}) is missing"
                    )
                matches = info.size == f.bytes and sha256_of(fs, full) == f.sha256
            except StagingError:
                raise
            except OSError as exc:
                raise StagingUnreadable(
                    f"checkpoint {manifest.checkpoint_id} of pipeline {manifest.pipeline!r}: "
                    f"staged file {f.path} ({label}) could not be read: "
                    f"{exc}. Nothing was published and nothing aborted; retry the commit once "
                    "the storage answers."
                ) from exc
            if not matches:
                raise StagingError(
                    f"checkpoint {manifest.checkpoint_id} of pipeline {manifest.pipeline!r}: "
                    f"staged file {f.path} ({label}) does not match its "
                    f"manifest (size {info.size} vs {f.bytes} or checksum differs)"
                )


def iter_batches(
    attempt_path: str, files: list[StagedFile], batch_size: int = 8192, store: StagingStore | None = None
) -> Iterator[Any]:
    """Stream a sink partition's staged rows as Arrow record batches (bounded memory)."""
    fs, root = _fs(attempt_path, store)
    for f in files:
        pf = pq.ParquetFile(fs.open_input_file(f"{root}/{f.path}"))
        yield from pf.iter_batches(batch_size=batch_size)


PROVENANCE_COLUMNS = ("src_topic", "src_partition", "src_offset")


def source_positions(
    attempt_path: str, files: dict[int, list[StagedFile]], store: StagingStore | None = None
) -> int:
    """Distinct source positions (topic, partition, offset) among the staged records of
    ``files`` (:func:`describe_attempt`), read here with Arrow: the three provenance columns
    only, records without a position left out."""
    import pyarrow as pa

    fs, root = _fs(attempt_path, store)
    tables = []
    for staged in files.values():
        for f in staged:
            table = pq.read_table(f"{root}/{f.path}", columns=list(PROVENANCE_COLUMNS), filesystem=fs)
            tables.append(table.filter(table.column("src_offset").is_valid()))
    if not tables:
        return 0
    positions = pa.concat_tables(tables)
    return int(positions.group_by(list(PROVENANCE_COLUMNS)).aggregate([]).num_rows)


def remove_checkpoint_attempts(
    checkpoint_dir: str, identity: str, recorded: str | None, store: StagingStore | None = None
) -> None:
    """Remove a committed checkpoint's staging that belongs to ledger ``identity``: the
    ``recorded`` attempt folder, attempts whose manifest names this identity (or none: older
    manifests), and attempts that never wrote a manifest (killed prepares). An attempt whose
    manifest names another identity (a same-name deployment staging beside this one) is
    left alone. The checkpoint folder goes once it is empty."""
    fs, root = _fs(checkpoint_dir, store)
    try:
        entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return
    kept = 0
    for entry in entries:
        if entry.type != pafs.FileType.Directory:
            kept += 1
            continue
        path = f"{checkpoint_dir.rstrip('/')}/{entry.base_name}"
        if recorded is None or os.path.normpath(path) != os.path.normpath(recorded):
            try:
                owner = read_manifest(path, store).identity
            except StagingNotVisible:
                owner = None  # never finished: garbage of a killed attempt
            except (StagingError, StagingUnreadable):
                kept += 1
                continue
            if owner not in (None, identity):
                kept += 1
                continue
        remove(path, store)
    if not kept:
        remove(checkpoint_dir, store)


def remove(path: str, store: StagingStore | None = None) -> None:
    """Delete a staging folder and everything under it (missing is fine)."""
    fs, root = _fs(path, store)
    try:
        fs.delete_dir(root)
    except FileNotFoundError:
        pass
