"""Plain frozen values the ledger returns: detached from any database session."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo.ledger.states import CheckpointState, ShardState

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class RangeSpec:
    """The offsets ``[start, end)`` of one topic-partition that one checkpoint reads.

    :param skipped_from: set only when ``on_data_loss=skip`` moved ``start`` forward past
        offsets that retention deleted; the original start, so ``[skipped_from, start)`` is
        recorded as lost rather than silently skipped.
    """

    topic: str
    partition: int
    start: int
    end: int
    skipped_from: int | None = None

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("RangeSpec.topic must be a non-empty topic name")
        if self.partition < 0:
            raise ValueError(f"{self.topic}[{self.partition}]: partition must be >= 0")
        if self.start < 0 or self.start > self.end:
            raise ValueError(
                f"{self.topic}[{self.partition}]: need 0 <= start <= end, "
                f"got start={self.start} end={self.end}"
            )
        if self.skipped_from is not None and not 0 <= self.skipped_from < self.start:
            raise ValueError(
                f"{self.topic}[{self.partition}]: skipped_from={self.skipped_from} must be "
                f"below start={self.start} (it is the offset retention forced us past)"
            )

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def compact(self) -> str:
        """``topic[p]:start-end`` as shown by ``eo checkpoints``."""
        skipped = f" (skipped from {self.skipped_from})" if self.skipped_from is not None else ""
        return f"{self.topic}[{self.partition}]:{self.start}-{self.end}{skipped}"


@dataclass(frozen=True)
class Actor:
    """Who moves a checkpoint: an Airflow task instance, a CLI user, a test. All optional."""

    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    hostname: str | None = None
    pid: int | None = None

    @classmethod
    def here(cls, **airflow: Any) -> Actor:
        """An actor for this process (hostname, pid) plus any Airflow ids given."""
        return cls(hostname=socket.gethostname(), pid=os.getpid(), **airflow)

    def to_arg(self) -> str:
        """The actor as an application's ``--actor-json`` value (the known fields only)."""
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})

    @classmethod
    def from_arg(cls, text: str | None) -> Actor | None:
        """The inverse of :meth:`to_arg` (None for no value)."""
        return cls(**json.loads(text)) if text else None

    def label(self) -> str:
        """``dag/run/task#try@host:pid``, leaving out what is unknown."""
        parts = [p for p in (self.dag_id, self.run_id, self.task_id) if p]
        text = "/".join(parts)
        if self.try_number is not None:
            text += f"#{self.try_number}"
        where = self.hostname or ""
        if self.pid is not None:
            where += f":{self.pid}"
        if where:
            text += f"@{where}"
        return text


@dataclass(frozen=True)
class ShardRecord:
    shard: int
    transactional_id: str
    producer_id: int | None
    producer_epoch: int | None
    state: ShardState
    records: int
    updated_at: dt.datetime


@dataclass(frozen=True)
class CommitPlan:
    """How a checkpoint is published, frozen when it is planned (docs/design.md §2).

    Every commit try of the checkpoint uses this plan, never the current settings, so a
    setting changed between a partial commit and its retry cannot move a sink partition
    to another shard (a duplicate) or drop a shard (a loss). Changed settings apply from
    the next checkpoint.

    :param sink_topic: the topic the output is published to.
    :param sink_partitions: the sink's partition count the output was partitioned for.
    :param transactional_id_prefix: the pipeline's pinned prefix (``{prefix}.{pipeline}.{shard}``).
    :param marker_group: the consumer group holding this pipeline's commit markers.
    :param shard_of_partition: the commit shard of each sink partition, by partition number.
    """

    sink_topic: str
    sink_partitions: int
    transactional_id_prefix: str
    marker_group: str
    shard_of_partition: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.shard_of_partition) != self.sink_partitions:
            raise ValueError(
                f"commit plan for {self.sink_topic!r}: {len(self.shard_of_partition)} shard "
                f"assignments for {self.sink_partitions} sink partitions"
            )

    @property
    def shards(self) -> int:
        """Number of commit shards (each has its own transactional id and marker)."""
        return max(self.shard_of_partition, default=-1) + 1

    def partitions_of(self, shard: int) -> list[int]:
        """The sink partitions shard ``shard`` publishes, in order."""
        return [p for p, s in enumerate(self.shard_of_partition) if s == shard]

    def to_json(self) -> dict[str, Any]:
        """The JSON stored in the checkpoint row."""
        return {
            "sink_topic": self.sink_topic,
            "sink_partitions": self.sink_partitions,
            "transactional_id_prefix": self.transactional_id_prefix,
            "marker_group": self.marker_group,
            "shard_of_partition": list(self.shard_of_partition),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommitPlan:
        """The inverse of :meth:`to_json`."""
        return cls(
            sink_topic=str(data["sink_topic"]),
            sink_partitions=int(data["sink_partitions"]),
            transactional_id_prefix=str(data["transactional_id_prefix"]),
            marker_group=str(data["marker_group"]),
            shard_of_partition=tuple(int(x) for x in data["shard_of_partition"]),
        )


@dataclass(frozen=True)
class CheckpointRecord:
    pipeline: str
    checkpoint_id: int
    state: CheckpointState
    lineage: int
    ranges: tuple[RangeSpec, ...]
    planned_at: dt.datetime
    prepared_at: dt.datetime | None = None
    committed_at: dt.datetime | None = None
    aborted_at: dt.datetime | None = None
    prepared_attempt: str | None = None
    staging_location: str | None = None
    records: int | None = None
    bytes: int | None = None
    shard_counts: Mapping[int, int] = field(default_factory=dict)
    #: (min, max) record timestamp per partition, filled at prepare.
    range_stats: Mapping[TopicPartition, tuple[int | None, int | None]] = field(default_factory=dict)
    shards: tuple[ShardRecord, ...] = ()
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None
    spark_app_id: str | None = None
    commit_owner: str | None = None
    commit_lease_until: dt.datetime | None = None
    abort_reason: str | None = None
    #: Frozen at plan time; None only for checkpoints planned before ledger revision 0002.
    commit_plan: CommitPlan | None = None
    #: Backfill checkpoints only: ``(start_ms, end_ms)``, the Kafka-timestamp interval
    #: ``[start, end)`` of the records it reads from its ranges.
    time_filter: tuple[int, int] | None = None
    #: Source accounting from the prepare (None before it, or for rows prepared by an
    #: older version): records read, dropped by the transform, created without a source
    #: position, sent to the dead-letter topic.
    records_read: int | None = None
    records_dropped: int | None = None
    records_created: int | None = None
    dead_letters: int | None = None
    #: A Structured Streaming sink's checkpoints only: the query's id and the micro-batch
    #: this checkpoint publishes (its ranges are the batch's, read from the query's offset log).
    query_id: str | None = None
    batch_id: int | None = None

    @property
    def offsets(self) -> dict[TopicPartition, tuple[int, int]]:
        """``{(topic, partition): (start, end)}``."""
        return {r.key: (r.start, r.end) for r in self.ranges}

    @property
    def end_offsets(self) -> dict[str, dict[int, int]]:
        """``{"topic": {partition: end}}``: what a savepoint of this checkpoint holds."""
        out: dict[str, dict[int, int]] = {}
        for r in self.ranges:
            out.setdefault(r.topic, {})[r.partition] = r.end
        return out

    @property
    def finished(self) -> bool:
        return self.state in (CheckpointState.COMMITTED, CheckpointState.ABORTED)

    def summary(self, *, max_ranges: int | None = None) -> dict[str, Any]:
        """The one JSON-ready description of a checkpoint (XCom, ``eo ... --json``, logs).

        :param max_ranges: keep the first ``max_ranges`` ranges and replace the rest by
            ``"... N more"`` (an XCom stays small at any partition count).
        """
        ranges = [r.compact() for r in self.ranges]
        if max_ranges is not None and len(ranges) > max_ranges:
            ranges = [*ranges[:max_ranges], f"... {len(ranges) - max_ranges} more"]
        return {
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id,
            "state": self.state.value,
            "lineage": self.lineage,
            "ranges": ranges,
            # Offsets planned, an upper bound: a transactional input has gaps (markers).
            "records_planned": sum(r.end - r.start for r in self.ranges),
            # Records actually read and staged (None until prepared).
            "records": self.records,
            "bytes": self.bytes,
            "records_read": self.records_read,
            "records_dropped": self.records_dropped,
            "records_created": self.records_created,
            "dead_letters": self.dead_letters,
            "planned_at": _iso(self.planned_at),
            "prepared_at": _iso(self.prepared_at),
            "committed_at": _iso(self.committed_at),
            "aborted_at": _iso(self.aborted_at),
            "prepared_attempt": self.prepared_attempt,
            "spark_app_id": self.spark_app_id,
            "abort_reason": self.abort_reason,
            "shards": [{"shard": s.shard, "state": s.state.value, "records": s.records} for s in self.shards],
            **({"time_filter": list(self.time_filter)} if self.time_filter is not None else {}),
            **({"query_id": self.query_id, "batch_id": self.batch_id} if self.query_id is not None else {}),
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True)
class PipelineRecord:
    name: str
    fingerprint: str
    current_lineage: int
    last_checkpoint_id: int
    created_at: dt.datetime
    updated_at: dt.datetime
    #: Created when this ledger first registered the pipeline; written into every commit
    #: marker so a re-created ledger or a second deployment with the same name is refused.
    identity: str = ""
    #: The transactional-id prefix pinned at the pipeline's first commit (None before it).
    transactional_id_prefix: str | None = None
    #: Set while the pipeline is stopped (plan refuses new checkpoints).
    stopped_at: dt.datetime | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None
    #: For a backfill pipeline: the live pipeline it re-processes.
    backfill_of: str | None = None
    #: Widest record-timestamp span of any prepared range (ms), None before the first.
    max_range_span_ms: int | None = None
    #: The absolute staging location pinned at registration (None: not pinned yet).
    staging_dir: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether new checkpoints are refused (``eo stop`` / stop-with-savepoint)."""
        return self.stopped_at is not None


@dataclass(frozen=True)
class SavepointRecord:
    pipeline: str
    name: str
    checkpoint_id: int | None
    offsets: Mapping[str, Mapping[int, int]]
    note: str
    created_by: str
    created_at: dt.datetime
    #: The pipeline's settings fingerprint when it was taken (None before revision 0003).
    fingerprint: str | None = None
    dag_id: str | None = None
    run_id: str | None = None

    @property
    def position(self) -> str:
        """Where it points, for messages: ``at checkpoint 7``; with no checkpoint id (taken
        after a restore or reset, before the new lineage committed anything) the offsets that
        restore or reset started from."""
        return savepoint_position(self.checkpoint_id)

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (``eo savepoint ... --json``, XCom)."""
        return {
            "pipeline": self.pipeline,
            "name": self.name,
            "checkpoint_id": self.checkpoint_id,
            "offsets": {t: {str(p): o for p, o in parts.items()} for t, parts in self.offsets.items()},
            "note": self.note,
            "created_by": self.created_by,
            "created_at": _iso(self.created_at),
            "fingerprint": self.fingerprint,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
        }


def savepoint_position(checkpoint_id: int | None) -> str:
    """See :attr:`SavepointRecord.position`."""
    if checkpoint_id is not None:
        return f"at checkpoint {checkpoint_id}"
    return "before the first checkpoint, at the offsets a restore or reset started from"


@dataclass(frozen=True)
class EventRecord:
    id: int
    pipeline: str
    checkpoint_id: int | None
    kind: str
    from_state: CheckpointState | None
    to_state: CheckpointState | None
    actor: str
    at: dt.datetime
    details: Mapping[str, Any]
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None


@dataclass(frozen=True)
class StreamRunRecord:
    """One run of a pipeline's streaming application (``eo_stream_runs``)."""

    pipeline: str
    run_id: str
    state: str  # RUNNING | ENDED | FAILED | LOST
    host: str
    pid: int
    commit_mode: str
    heartbeat_s: float
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    ended_at: dt.datetime | None = None
    reason: str = ""
    summary: Mapping[str, Any] | None = None
    error: str | None = None
    stop_requested_at: dt.datetime | None = None
    stop_requested_by: str | None = None
    dag_id: str | None = None
    task_id: str | None = None
    log_path: str | None = None
    #: Seconds since the last heartbeat on the database's clock when read (None: unknown).
    heartbeat_age_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (trigger events, XCom)."""
        return {
            "pipeline": self.pipeline,
            "run_id": self.run_id,
            "state": self.state,
            "host": self.host,
            "pid": self.pid,
            "commit": self.commit_mode,
            "heartbeat_s": self.heartbeat_s,
            "started_at": _iso(self.started_at),
            "heartbeat_at": _iso(self.heartbeat_at),
            "ended_at": _iso(self.ended_at),
            "reason": self.reason,
            "summary": dict(self.summary) if self.summary is not None else None,
            "error": self.error,
            "stop_requested_at": _iso(self.stop_requested_at),
            "stop_requested_by": self.stop_requested_by,
            "log_path": self.log_path,
            "heartbeat_age_s": self.heartbeat_age_s,
        }
