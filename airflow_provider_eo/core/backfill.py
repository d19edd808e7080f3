"""Backfill ``[start, end)`` of a live pipeline from the offsets its ledger recorded as
COMMITTED, into a separate sink, exactly once (docs/design.md §7).

The backfill runs as a *derived* pipeline (:func:`backfill_pipeline`): its own name per
(live pipeline, target topic), its own consumer group, marker group and transactional ids,
its own ledger row (``backfill_of`` set). So the one commit protocol (frozen plan, markers,
lease, fencing) publishes it unchanged and never touches the live pipeline's group. Each
of its checkpoints reads committed offset ranges and keeps the records whose Kafka
timestamp lies in the checkpoint's time filter; the ledger refuses a checkpoint that would
read a record another one reads (ledger/backfill.py), so a rerun, a retry or an
overlapping request adds nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo.core.commit_plan import record_planned, sink_partitions
from airflow_provider_eo.core.coordinator import Coordinator, Planned
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.markers import check_marker_identity
from airflow_provider_eo.core.metrics import MetricsSink
from airflow_provider_eo.core.plan import lost_ranges, resume_unfinished
from airflow_provider_eo.core.prepare import Stager, prepare_checkpoint
from airflow_provider_eo.core.shard import KafkaClients, ShardRunner
from airflow_provider_eo.errors import BackfillRefused, DataLossError, KafkaAdminError
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointNotFound,
    CheckpointRecord,
    Ledger,
    PipelineFingerprintMismatch,
    RangeSpec,
)
from airflow_provider_eo.ledger.backfill import next_checkpoint_ranges
from airflow_provider_eo.pipeline import Pipeline, backfill_name

log = logging.getLogger(__name__)

PrepareFn = Callable[[Pipeline, Ledger, int], None]
ProgressFn = Callable[[CheckpointRecord], None]


def iso_ms(ms: int) -> str:
    """``ms`` (epoch milliseconds) as an ISO-8601 UTC string, for messages."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")


def parse_instant(text: str) -> int:
    """An ISO-8601 instant (``2024-05-01``, ``2024-05-01T00:00:00Z``, with an offset) as epoch
    milliseconds; a time without a zone is UTC. ValueError naming the text otherwise."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an ISO-8601 date or time (e.g. 2024-05-01T00:00:00Z)") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(value.timestamp() * 1000)


def backfill_pipeline(
    live: Pipeline, sink_topic: str, *, transform: str | None = None, allow_live_sink: bool = False
) -> Pipeline:
    """The derived pipeline that backfills ``live`` into ``sink_topic``: name
    ``<live>.bf.<target>`` (a readable prefix plus a hash when that is too long), its own
    consumer group, the live pipeline's transform unless ``transform`` is given, one
    checkpoint in flight. The same (live, target) always gives the same identity.

    Refused (:class:`BackfillRefused`) when ``sink_topic`` is empty or is the live sink
    (unless ``allow_live_sink``: its records would then be published twice there).
    """
    if not sink_topic:
        raise BackfillRefused(
            f"pipeline {live.name!r}: a backfill needs a sink topic (--sink-topic TOPIC): it "
            "publishes into a separate topic, never silently into the live sink"
        )
    if live.backfill_of is not None:
        raise BackfillRefused(
            f"pipeline {live.name!r} is itself the backfill of {live.backfill_of!r}: backfill "
            f"{live.backfill_of!r} instead"
        )
    if sink_topic == live.sink_topic and not allow_live_sink:
        raise BackfillRefused(
            f"pipeline {live.name!r}: {sink_topic!r} is the live pipeline's own sink; a backfill "
            "there publishes the interval's records a second time next to the live output. "
            "Backfill into a separate topic (--sink-topic), or pass --allow-live-sink "
            "(allow_live_sink=True) if that duplicate is what you want."
        )
    if sink_topic in live.source_topics:
        raise BackfillRefused(
            f"pipeline {live.name!r}: the backfill sink {sink_topic!r} is one of its source "
            "topics; pick a separate topic"
        )
    name = backfill_name(live.name, sink_topic)
    return dataclasses.replace(
        live,
        name=name,
        sink_topic=sink_topic,
        transform=transform if transform is not None else live.transform,
        consumer_group=f"eo.{name}",
        backfill_of=live.name,
        max_pending=1,
    )


def _check_request(live: Pipeline, ledger: Ledger, start_ms: int, end_ms: int) -> None:
    """Refuse an empty interval and a live pipeline the ledger never committed anything of."""
    if end_ms <= start_ms:
        raise BackfillRefused(
            f"pipeline {live.name!r}: the backfill interval ends ({iso_ms(end_ms)}) at or before "
            f"it starts ({iso_ms(start_ms)}); give --end after --start"
        )
    try:
        ledger.get_pipeline(live.name)
    except CheckpointNotFound as exc:
        raise BackfillRefused(
            f"pipeline {live.name!r} is not in the ledger at {ledger.url}: there is nothing to "
            "backfill. Check the pipeline name and its ledger_url, or run the pipeline first."
        ) from exc
    if ledger.last_committed(live.name) is None:
        raise BackfillRefused(
            f"pipeline {live.name!r} has no COMMITTED checkpoint yet: a backfill re-processes "
            "only what the live pipeline committed. Run the pipeline first."
        )


def _lost_error(derived: Pipeline, cp: CheckpointRecord, lost: list[str]) -> DataLossError:
    """A backfill checkpoint PLANNED over offsets Kafka deleted (a backfill never skips)."""
    return DataLossError(
        f"backfill pipeline {derived.name!r} (of {derived.backfill_of!r}), checkpoint "
        f"{cp.checkpoint_id}: its planned offsets can no longer be read from Kafka: "
        f"{'; '.join(lost)}. Nothing of it was published. Those records cannot be "
        "backfilled from Kafka; abort the checkpoint (Ledger(url).abort("
        f"{derived.name!r}, {cp.checkpoint_id}, reason=...)) and backfill an interval "
        "after the lost offsets."
    )


def plan_backfill(
    live: Pipeline,
    ledger: Ledger,
    start_ms: int,
    end_ms: int,
    *,
    sink_topic: str,
    transform: str | None = None,
    allow_live_sink: bool = False,
    actor: Actor | None = None,
    clients: KafkaClients | None = None,
) -> CheckpointRecord | None:
    """The backfill pipeline's unfinished checkpoint, else the next checkpoint of
    ``[start_ms, end_ms)``, else None (the interval is done).

    Every refusal (:class:`BackfillRefused`, :class:`DataLossError` naming the lost ranges)
    happens before the ledger is written, so a refused request changes nothing. Idempotent
    per call: an unfinished checkpoint is returned again until it finishes.
    """
    clients = kafka_clients(live.kafka, clients)
    derived = backfill_pipeline(live, sink_topic, transform=transform, allow_live_sink=allow_live_sink)
    _check_request(live, ledger, start_ms, end_ms)
    try:
        existing = ledger.get_pipeline(derived.name)
    except CheckpointNotFound:
        existing = None
    if existing is not None:
        if existing.fingerprint != derived.fingerprint():
            raise BackfillRefused(
                f"backfill pipeline {derived.name!r} (pipeline {live.name!r} into {sink_topic!r}) "
                "was recorded with other settings (transform or source topics): one backfill "
                "target keeps one transform. Use the transform it was run with, or backfill "
                "into another sink topic."
            )
        unfinished = ledger.unfinished(derived.name)
        if unfinished is not None:
            resumed = resume_unfinished(
                derived, ledger, unfinished, may_skip=False, lost_error=_lost_error, clients=clients
            )
            assert resumed is not None  # never skipped
            return resumed
    try:
        partition_count = sink_partitions(live, sink_topic, clients=clients)
    except KafkaAdminError as exc:
        raise BackfillRefused(
            f"backfill of pipeline {live.name!r} into {sink_topic!r}: {exc} Nothing was planned."
        ) from exc
    segments = ledger.backfill_work(live.name, derived.name, start_ms, end_ms)
    if not segments:
        return None
    # Offsets of the whole interval that Kafka no longer has fail now, before any progress.
    wanted = [
        RangeSpec(t, p, a, b) for seg in segments for (t, p), parts in seg.work.items() for a, b in parts
    ]
    lost = lost_ranges(live, wanted, clients=clients)
    if lost:
        raise DataLossError(
            f"backfill of pipeline {live.name!r} [{iso_ms(start_ms)}, {iso_ms(end_ms)}) into "
            f"{sink_topic!r}: offsets the live pipeline committed for this interval are gone "
            f"from Kafka: {'; '.join(sorted(set(lost)))}. Nothing was planned. Those records "
            "cannot be re-processed from Kafka (restore them from another copy), or backfill "
            "an interval that starts after them."
        )
    nxt = next_checkpoint_ranges(segments, derived.max_records_per_checkpoint)
    if nxt is None:
        return None
    segment, ranges = nxt
    try:
        registered = ledger.register_backfill_pipeline(
            derived.name, derived.fingerprint(), backfill_of=live.name
        )
    except PipelineFingerprintMismatch as exc:  # a concurrent first run with another transform
        raise BackfillRefused(str(exc)) from exc
    prefix = ledger.pin_transactional_id_prefix(derived.name, derived.transactional_id_prefix)
    check_marker_identity(derived, registered.identity, clients=clients)
    return record_planned(
        derived,
        ledger,
        ranges,
        prefix=prefix,
        partitions=partition_count,
        max_pending=derived.max_pending,
        actor=actor,
        details={"interval": [start_ms, end_ms], "sink_topic": sink_topic},
        time_filter=(segment.start_ms, segment.end_ms),
    )


@dataclass(frozen=True)
class BackfillRequest:
    """A backfill: process again what pipeline ``live`` committed in ``[start_ms, end_ms)``
    into ``sink_topic``, with ``transform`` (None: the live pipeline's); ``allow_live_sink``
    lets it write into the live sink topic. The CLI (``eo backfill``), the operator
    (``EoBackfillOperator``) and scripts build one and hand it to :func:`run_backfill`.

    It is also the coordinator's range source of the backfill: the offset ranges the live
    pipeline's ledger recorded as COMMITTED for the interval (:func:`plan_backfill`). The
    coordinator's pipeline is the derived one (:meth:`derived`)."""

    live: Pipeline
    start_ms: int
    end_ms: int
    sink_topic: str
    transform: str | None = None
    allow_live_sink: bool = False

    def derived(self) -> Pipeline:
        """The backfill pipeline the checkpoints are recorded under."""
        return backfill_pipeline(
            self.live, self.sink_topic, transform=self.transform, allow_live_sink=self.allow_live_sink
        )

    def plan(
        self, pipeline: Pipeline, ledger: Ledger, actor: Actor, clients: KafkaClients | None = None
    ) -> Planned:
        """:func:`plan_backfill`: the unfinished checkpoint, else the next one, else nothing."""
        clients = kafka_clients(pipeline.kafka, clients)
        return Planned.of(
            plan_backfill(
                self.live,
                ledger,
                self.start_ms,
                self.end_ms,
                sink_topic=self.sink_topic,
                transform=self.transform,
                allow_live_sink=self.allow_live_sink,
                actor=actor,
                clients=clients,
            )
        )


@dataclass(frozen=True)
class BackfillResult:
    """What :func:`run_backfill` did: the checkpoints it finished, in order, and their records."""

    pipeline: str
    backfill_pipeline: str
    checkpoints: tuple[CheckpointRecord, ...] = ()
    records: int = 0
    sink_topic: str = ""
    start_ms: int | None = None
    end_ms: int | None = None
    seconds: float = 0.0
    steps: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> dict[str, Any]:
        """JSON-ready (``eo backfill --json``, the operator's XCom)."""
        return {
            "pipeline": self.pipeline,
            "backfill_pipeline": self.backfill_pipeline,
            "sink_topic": self.sink_topic,
            "start": iso_ms(self.start_ms) if self.start_ms is not None else None,
            "end": iso_ms(self.end_ms) if self.end_ms is not None else None,
            "checkpoints": [cp.checkpoint_id for cp in self.checkpoints],
            "records": self.records,
            "seconds": round(self.seconds, 3),
            "details": [
                {
                    "checkpoint_id": cp.checkpoint_id,
                    "time_filter": [iso_ms(x) for x in cp.time_filter] if cp.time_filter else None,
                    "ranges": [r.compact() for r in cp.ranges],
                    "records": cp.records,
                }
                for cp in self.checkpoints
            ],
        }


@dataclass(frozen=True)
class LocalPrepare:
    """A :data:`PrepareFn` that prepares in this process with ``stager`` (its engine starts
    at the first prepare); :func:`run_backfill` runs it through its coordinator, so its time
    is reported with the other metrics."""

    stager: Stager

    def __call__(self, pipeline: Pipeline, ledger: Ledger, checkpoint_id: int) -> None:
        prepare_checkpoint(pipeline, ledger, checkpoint_id, stager=self.stager)


def local_prepare(stager: Stager) -> PrepareFn:
    """A :data:`PrepareFn` that prepares in this process with ``stager``."""
    return LocalPrepare(stager)


def run_backfill(
    request: BackfillRequest,
    ledger: Ledger,
    *,
    actor: Actor | None = None,
    prepare: PrepareFn,
    progress: ProgressFn | None = None,
    runner: ShardRunner | None = None,
    say: Callable[[str], None] | None = None,
    clients: KafkaClients | None = None,
    metrics: MetricsSink | None = None,
) -> BackfillResult:
    """Carry out ``request`` to the end of its interval: resume the backfill pipeline's
    unfinished checkpoint (prepare it if PLANNED, commit it), else plan the next one; until
    nothing is left. ``prepare`` prepares a PLANNED checkpoint of the backfill pipeline
    (:func:`local_prepare` in this process, or a spark-submit); ``progress`` is called with
    each checkpoint once it is COMMITTED. A spark-mode pipeline's commits run through
    ``runner`` (spark/commit.py's ``SparkShardRunner``); without one, or where it cannot
    start Spark, in this process, and ``say`` (default: a log warning) gets a line saying so.
    ``clients``: the commit's Kafka side (unit tests pass a fake); ``metrics``: where each
    prepare and commit is reported (core/metrics.py; none: nowhere).

    Idempotent: a rerun after a kill at any point finishes the interrupted checkpoint and
    adds only what is missing; a rerun of a finished interval plans nothing.
    """
    started = time.monotonic()
    derived = request.derived()
    coordinator = Coordinator(
        derived,
        ledger,
        actor,
        runner=runner,
        fallback=say or log.warning,
        clients=clients,
        metrics=metrics,
    )
    done: list[CheckpointRecord] = []
    steps: list[str] = []
    while True:
        planned = coordinator.plan(request)
        cp = planned.checkpoint
        if cp is None:
            break
        if any(d.checkpoint_id == cp.checkpoint_id for d in done):  # never loop on one
            raise RuntimeError(f"backfill pipeline {derived.name!r}: checkpoint {cp.checkpoint_id} again")
        if planned.step == "prepare" and isinstance(prepare, LocalPrepare):
            coordinator.prepare(cp.checkpoint_id, prepare.stager)
            steps.append(f"prepare:{cp.checkpoint_id}")
        elif planned.step == "prepare":  # elsewhere (a spark-submit): its driver reports its time
            coordinator.prepare_with(cp.checkpoint_id, lambda cid: prepare(derived, ledger, cid))
            steps.append(f"prepare:{cp.checkpoint_id}")
        committed = coordinator.commit(cp.checkpoint_id)
        steps.append(f"commit:{cp.checkpoint_id}:{committed.published}")
        done.append(committed.checkpoint)
        log.info(
            "backfill %s: checkpoint %d committed (%s records)",
            derived.name,
            cp.checkpoint_id,
            committed.checkpoint.records,
        )
        if progress is not None:
            progress(committed.checkpoint)
    return BackfillResult(
        pipeline=request.live.name,
        backfill_pipeline=derived.name,
        checkpoints=tuple(done),
        records=sum(cp.records or 0 for cp in done),
        sink_topic=request.sink_topic,
        start_ms=request.start_ms,
        end_ms=request.end_ms,
        seconds=time.monotonic() - started,
        steps=tuple(steps),
    )
