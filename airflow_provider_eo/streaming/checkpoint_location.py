"""A Structured Streaming query's checkpoint location read and copied outside Spark (the
``eo`` commands run without a Spark session): the query's id, the batches of its offset and
commit logs, and a copy of the location as of one batch Spark committed.

Paths are local folders or URIs, opened through the staging filesystem layer
(:mod:`airflow_provider_eo.staging_fs`: ``s3a://``/``s3://``, ``gs://``, ``abfss://``,
``hdfs://``), with the pipeline's S3 settings when the caller gives its store.

What a copy at batch N holds (what Spark needs to restart the query after N):

- ``metadata`` (the query's id) and ``sources/`` (each source's initial offsets);
- ``offsets/0..N`` and ``commits/0..N`` (Spark restarts at the batch after the newest entry
  of both logs; nothing above N is copied, so a copy taken while the query runs is at N);
- ``state/``: every file of a state version up to N+1 (batch N leaves version N+1: its
  ``.delta``/``.snapshot``, a RocksDB store's ``.zip``/``.changelog``), the operators'
  metadata and schema files, a RocksDB store's SST files; nothing of a later version.

Spark writes each of these files once (to a temporary name, then renamed), so the files of
batch N and below do not change while the query runs on; it deletes old ones as the query
moves on (``spark.sql.streaming.minBatchesToRetain`` batches are kept). A file that vanishes
while it is copied makes the copy fail and be removed: the query moved too far meanwhile.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from airflow_provider_eo.errors import CheckpointLocationError as CheckpointLocationError
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.staging_fs import StagingStore, with_store

__all__ = [
    "CheckpointCopy",
    "CheckpointLocationError",
    "QueryLocation",
    "copy_at_batch",
    "keep_in_copy",
    "read_location",
    "remove_copy",
]


@dataclass(frozen=True)
class QueryLocation:
    """What a checkpoint location says of its query.

    :param location: the location as given.
    :param query_id: the id in ``metadata`` (None: no metadata file, not a query's location).
    :param latest_offsets: the newest batch of the offset log (planned by Spark), or None.
    :param latest_commit: the newest batch of the commit log (finished by Spark), or None.
    """

    location: str
    query_id: str | None
    latest_offsets: int | None
    latest_commit: int | None


@dataclass(frozen=True)
class CheckpointCopy:
    """A copy of a checkpoint location as of batch ``batch_id``."""

    source: str
    destination: str
    query_id: str
    batch_id: int
    files: int
    bytes: int


def _fs(location: str, store: StagingStore | None = None) -> tuple[pafs.FileSystem, str]:
    if "://" in location:
        try:
            fs, path = with_store(store).open(location.rstrip("/"))
            return fs, path.rstrip("/")
        except (pa.ArrowInvalid, OSError, ValueError, ConfigError) as exc:
            raise CheckpointLocationError(
                f"checkpoint location {location!r}: cannot open it here ({exc}); give a local folder "
                "or an s3a://, gs://, abfss:// or hdfs:// URI this process can read"
            ) from exc
    return pafs.LocalFileSystem(), os.path.abspath(location).rstrip("/")


def _read_text(fs: pafs.FileSystem, path: str) -> str | None:
    try:
        with fs.open_input_stream(path) as f:
            return bytes(f.read()).decode("utf-8")
    except FileNotFoundError:
        return None


def _batches(fs: pafs.FileSystem, folder: str) -> list[int]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    return sorted(int(i.base_name) for i in infos if i.type == pafs.FileType.File and i.base_name.isdigit())


def read_location(location: str, store: StagingStore | None = None) -> QueryLocation:
    """The query id and the newest batches of ``location``'s offset and commit logs
    (``store``: the pipeline's S3 settings, see :mod:`airflow_provider_eo.staging_fs`)."""
    fs, root = _fs(location, store)
    text = _read_text(fs, f"{root}/metadata")
    ident: str | None = None
    if text is not None:
        try:
            ident = str(json.loads(text.strip().splitlines()[0]).get("id") or "") or None
        except (ValueError, IndexError, AttributeError) as exc:
            raise CheckpointLocationError(
                f"checkpoint location {location!r}: its 'metadata' file is not Spark's ({exc})"
            ) from exc
    offsets = _batches(fs, f"{root}/offsets")
    commits = _batches(fs, f"{root}/commits")
    return QueryLocation(
        location=location,
        query_id=ident,
        latest_offsets=offsets[-1] if offsets else None,
        latest_commit=commits[-1] if commits else None,
    )


_LEADING_NUMBER = re.compile(r"(\d+)")
_CHUNK = 8 << 20


def keep_in_copy(relative: str, batch_id: int) -> bool:
    """Whether the file at ``relative`` (to the location's root, ``/``-separated) belongs in a
    copy as of batch ``batch_id`` (see the module docstring; pure)."""
    parts = relative.split("/")
    name = parts[-1]
    if name.endswith(".tmp"):  # a file Spark was writing
        return False
    base = name[1:-4] if name.startswith(".") and name.endswith(".crc") else name  # Hadoop checksums
    top = parts[0]
    if top in ("offsets", "commits"):
        return len(parts) == 2 and base.isdigit() and int(base) <= batch_id
    if top == "state":
        if base.endswith(".sst"):  # a RocksDB store's shared files, named by file number
            return True
        number = _LEADING_NUMBER.match(base)
        return number is None or int(number.group(1)) <= batch_id + 1
    return True


def copy_at_batch(
    location: str, destination: str, batch_id: int, store: StagingStore | None = None
) -> CheckpointCopy:
    """Copy ``location`` as of batch ``batch_id`` (which Spark must have committed there) to
    ``destination`` (absent or an empty folder). Safe while the query runs; a partial copy is
    removed when anything fails."""
    src_fs, src = _fs(location, store)
    dst_fs, dst = _fs(destination, store)
    where = f"checkpoint location {location!r}"
    facts = read_location(location)
    if facts.query_id is None:
        raise CheckpointLocationError(f"{where} has no 'metadata' file: is it the query's location?")
    if src_fs.get_file_info(f"{src}/commits/{batch_id}").type != pafs.FileType.File:
        raise CheckpointLocationError(
            f"{where}: Spark has not committed batch {batch_id} there (no commits/{batch_id}; its newest "
            f"commit is {facts.latest_commit}); nothing was copied"
        )
    existing = dst_fs.get_file_info(pafs.FileSelector(dst, allow_not_found=True))
    if existing:
        raise CheckpointLocationError(
            f"copy destination {destination!r} is not empty; nothing was copied. Give a new folder."
        )
    infos = src_fs.get_file_info(pafs.FileSelector(src, recursive=True))
    files = 0
    size = 0
    try:
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(src) :].lstrip("/")
            if not keep_in_copy(relative, batch_id):
                continue
            target = f"{dst}/{relative}"
            dst_fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            try:
                with src_fs.open_input_stream(info.path) as r, dst_fs.open_output_stream(target) as w:
                    while chunk := r.read(_CHUNK):  # state snapshots may be large
                        w.write(chunk)
                        size += len(chunk)
            except FileNotFoundError as exc:
                raise CheckpointLocationError(
                    f"{where}: {relative} vanished while it was copied (Spark removed it as the query "
                    f"moved on past batch {batch_id}); nothing was kept. Take the copy again, or stop "
                    "the query first."
                ) from exc
            files += 1
        for needed in (f"offsets/{batch_id}", f"commits/{batch_id}", "metadata"):
            if dst_fs.get_file_info(f"{dst}/{needed}").type != pafs.FileType.File:
                raise CheckpointLocationError(
                    f"{where}: {needed} was not copied (removed by Spark meanwhile?); nothing was kept"
                )
    except BaseException:
        remove_copy(destination)
        raise
    return CheckpointCopy(
        source=location,
        destination=destination,
        query_id=facts.query_id,
        batch_id=batch_id,
        files=files,
        bytes=size,
    )


def remove_copy(destination: str, store: StagingStore | None = None) -> None:
    """Remove a copy (nothing when it is not there)."""
    fs, dst = _fs(destination, store)
    if fs.get_file_info(dst).type == pafs.FileType.Directory:
        fs.delete_dir(dst)
