"""The roles of one shard's commit as small objects: the frozen :class:`ShardCommittable` (picklable:
it travels to a Spark task as one object), the hooks its caller keeps the ledger with, what
a shard task returns (:class:`Publisher`, :class:`ShardFailure`) and where shards run
(:class:`ShardRunner`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import pyarrow as pa

from airflow_provider_eo import staging, staging_fs


@dataclass(frozen=True)
class ShardCommittable:
    """Everything one shard's transaction needs, frozen from the checkpoint's commit plan
    and manifest: picklable, no ledger, no live client."""

    pipeline: str
    identity: str  # the ledger's identity of the pipeline (markers and provenance name it)
    checkpoint_id: int
    shard: int
    transactional_id: str
    sink_topic: str
    staging_location: str
    parts: tuple[tuple[int, tuple[staging.StagedFile, ...]], ...]  # sink partition -> files
    marker_group: str
    group_id: str | None  # the pipeline's consumer group, moved by this shard's seal (or None)
    group_offsets: tuple[tuple[str, int, int], ...]  # (topic, partition, end) sent with the seal
    kafka: tuple[tuple[str, Any], ...]  # librdkafka client config
    transaction_timeout_ms: int
    topic_max_bytes: int | None = None
    # The checkpoint's dead letters (the shard that moves the group publishes them) and
    # their topic.
    dead_letter_topic: str | None = None
    dead_letters: tuple[staging.StagedFile, ...] = ()
    # How the staged files are opened (S3 settings and credentials: never logged); the
    # same on an executor as in the committing process.
    staging_store: staging_fs.StagingStore | None = None

    @property
    def config(self) -> dict[str, Any]:
        """The librdkafka client config."""
        return dict(self.kafka)

    @property
    def where(self) -> str:
        """The prefix of every error message: pipeline, checkpoint, shard."""
        return f"pipeline {self.pipeline!r}, checkpoint {self.checkpoint_id}, shard {self.shard}: "

    @property
    def timeout_s(self) -> float:
        """The transaction timeout in seconds."""
        return self.transaction_timeout_ms / 1000

    @property
    def partitions(self) -> list[int]:
        """The shard's sink partitions that have staged files."""
        return [p for p, _files in self.parts]

    @property
    def records(self) -> int:
        """Records staged for this shard."""
        return sum(f.records for _p, files in self.parts for f in files)

    def files_of(self, partition: int) -> list[staging.StagedFile]:
        """The staged files of one sink partition, in publish order."""
        return next((list(files) for p, files in self.parts if p == partition), [])

    def batches(self, partition: int) -> Iterator[pa.RecordBatch]:
        """The staged rows of one sink partition, as Arrow batches (bounded memory)."""
        return staging.iter_batches(self.staging_location, self.files_of(partition), store=self.staging_store)


class ShardHooks(Protocol):
    """What the caller records around one shard's transaction (the ledger, in local mode).
    Called at fixed points of :func:`commit_shard`."""

    def may_have_published(self) -> bool:
        """When the marker is missing: could a try of this checkpoint have begun a
        transaction for the shard (a shard row exists)? False means certainly not."""

    def before_begin(self) -> None:
        """Right before ``begin_transaction``: take the commit lease and record the shard
        PENDING (the missing-marker proof relies on the row existing before any begin)."""

    def committed(self, records: int) -> None:
        """The shard's transaction is committed (or the marker shows it was)."""


@dataclass(frozen=True)
class ShardResult:
    """What :func:`commit_shard` did for one shard."""

    shard: int
    records: int  # records produced by this call
    skipped: bool  # the marker already showed the checkpoint: nothing was sent
    rounds: int


@dataclass(frozen=True)
class Publisher:
    """The process that published (or found published) one shard.

    :param executor: the Spark executor id (``"driver"``: a task in the driver's JVM, local
        mode; ``"local"``: a local-mode commit, in the committing process itself).
    :param attempt: the Spark task attempt that did it (0 for a local commit).
    :param skipped: the shard's marker already showed the checkpoint: nothing was sent.
    :param publish_s: seconds the publishing transaction took (None when skipped).
    """

    shard: int
    host: str
    pid: int
    records: int
    executor: str = "local"
    attempt: int = 0
    skipped: bool = False
    publish_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``eo commit --json``'s ``publishers``)."""
        return asdict(self)


@dataclass(frozen=True)
class ShardTask:
    """What a commit task gets: the shard's committable and whether the ledger had a row for
    the shard before this commit started (a try before it may have begun a transaction)."""

    committable: ShardCommittable
    row_before: bool


@dataclass(frozen=True)
class ShardFailure:
    """A shard task's error, returned (not raised) so the driver re-raises it as the same
    eo error with its message; :func:`commit_shard` already ran its own rounds, so Spark
    must not retry the task for it (only for a lost process)."""

    shard: int
    error: str  # the class name, in airflow_provider_eo.errors when it is an eo error
    message: str
    host: str
    pid: int


class ShardRunner(Protocol):
    """Runs shard transactions somewhere else than this process (a spark-mode commit:
    spark/commit.py runs each in a Spark task). The commit driver keeps the ledger."""

    @property
    def master(self) -> str:
        """Where the shards would run (a Spark master URL: ``local[...]`` or a cluster)."""

    @property
    def session_running(self) -> bool:
        """A Spark session is already running (a commit would not pay its start)."""

    @property
    def executors_elsewhere(self) -> bool:
        """The running session has executors on other hosts than this one (True when not
        known yet)."""

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        """Commit ``tasks`` in parallel; ``on_outcome`` (called in the caller's thread) gets
        each shard's outcome as it arrives. Returns every shard's outcome, or the exception
        of a shard whose run failed as a whole (its process lost too often)."""

    def unavailable(self) -> str | None:
        """Why no shard can run there now (None: it can); a caller may then commit locally."""

    def cancel(self, pipeline: str, checkpoint_id: int) -> None:
        """Stop the checkpoint's shards: none that has not started begins (called from
        another thread while :meth:`run` waits, when the commit lost its lease)."""
