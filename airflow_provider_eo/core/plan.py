"""Plan (or resume) a pipeline's next checkpoint: an exact offset range per partition, and
the commit plan it will be published with (frozen with it, docs/design.md §2)."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit_plan import (
    check_commit_plan,
    pinned_prefix,
    record_planned,
    sink_partitions,
)
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.core.sink_guard import check_sink
from airflow_provider_eo.errors import DataLossError, PipelineStopped, SourceError
from airflow_provider_eo.ledger import (
    Actor,
    CheckpointRecord,
    CheckpointState,
    Ledger,
    RangeSpec,
)
from airflow_provider_eo.pipeline import Pipeline

TP = tuple[str, int]

log = logging.getLogger(__name__)


def startup_offsets(
    pipeline: Pipeline, partitions: list[TP], *, clients: KafkaClients | None = None
) -> dict[TP, int]:
    """Where partitions the ledger has never seen start, by the pipeline's startup policy."""
    clients = kafka_clients(pipeline.kafka, clients)
    if not partitions:
        return {}
    mode = pipeline.startup.mode
    if mode == "earliest":
        return clients.list_offsets(partitions, spec="earliest")
    if mode == "latest":
        return clients.list_offsets(partitions, spec="latest")
    if mode == "timestamp":
        assert pipeline.startup.timestamp_ms is not None
        return clients.offsets_for_timestamp(partitions, pipeline.startup.timestamp_ms)
    if mode == "offsets":
        given = pipeline.startup.offsets or {}
        out: dict[TP, int] = {}
        rest: list[TP] = []
        for topic, partition in partitions:
            if partition in given.get(topic, {}):
                out[(topic, partition)] = int(given[topic][partition])
            else:
                rest.append((topic, partition))
        if rest:  # partitions not named start by the fallback
            out.update(clients.list_offsets(rest, spec=pipeline.startup.fallback))
        return out
    # group: the consumer group's committed offsets, else the fallback
    committed = clients.committed_offsets(pipeline.group_id, partitions)
    missing = [tp for tp in partitions if tp not in committed]
    if missing:
        committed.update(clients.list_offsets(missing, spec=pipeline.startup.fallback))
    return committed


def cap_ranges(starts: Mapping[TP, int], ends: Mapping[TP, int], budget: int) -> dict[TP, int]:
    """New ends so the total planned offsets stay within ``budget``, shared fairly
    (water-filling: partitions with little data take all of it, the rest split the remainder)."""
    avail = {tp: max(0, ends[tp] - starts[tp]) for tp in starts}
    order = sorted(avail, key=lambda tp: (avail[tp], tp))
    take: dict[TP, int] = {}
    remaining = budget
    for i, tp in enumerate(order):
        share = remaining // (len(order) - i)
        take[tp] = min(avail[tp], share)
        remaining -= take[tp]
    return {tp: starts[tp] + take[tp] for tp in starts}


# -- checkpoint sizing: a shard's publish stays well inside transaction.timeout.ms ----------

#: The share of ``transaction.timeout.ms`` a checkpoint's publish may take by plan; the rest
#: is margin (the seal and the commit, a slower moment of the broker or the host).
PUBLISH_TIMEOUT_SHARE = 0.5
#: Source offsets published per second assumed until the ledger has measured a commit of the
#: pipeline. Low on purpose: a local broker takes 300k-500k small records/s from one commit,
#: large records over a slow link far fewer. At the default 60 s timeout it allows 150,000
#: offsets: a new pipeline's first checkpoints stay that small until a commit is measured.
DEFAULT_PUBLISH_RATE = 5_000.0
#: How many recent committed checkpoints the publish rate is measured from (their median).
RATE_SAMPLES = 5


@dataclass(frozen=True)
class PublishRate:
    """How fast a pipeline's commits publish, measured from its recent COMMITTED checkpoints
    in the ledger."""

    offsets_per_s: float  # source offsets per second, median over the samples
    largest_share: float  # the largest commit shard's share of a checkpoint's records (max)
    samples: int


@dataclass(frozen=True)
class CheckpointBudget:
    """How many source offsets the next checkpoint may plan so that its largest shard's
    publish takes at most :data:`PUBLISH_TIMEOUT_SHARE` of ``transaction.timeout.ms``."""

    offsets: int
    offsets_per_s: float
    largest_share: float
    measured: bool  # False: the default rate (nothing measured yet)


def _publish_sample(ledger: Ledger, cp: CheckpointRecord, timeout_s: float) -> tuple[float, float] | None:
    """(source offsets per second, largest shard share) of one checkpoint's commit, or None
    when it says nothing about the rate (not committed, nothing published, no publish time
    recorded: every shard was published by a process that died before recording it).

    Only the transactions that published count: each shard's ``publish`` event holds the
    seconds from its successful try's commit lease (right before ``begin_transaction``) to
    its commit, so a failed, fenced or aborted try before it, a broker that was down in
    between and the wait for a retry are not in the rate. The shards commit one after
    another, so the checkpoint's rate is its published offsets over the sum of their times.
    Each shard's time counts at most ``timeout_s`` (the transaction timeout): a transaction
    the broker let commit was not open longer, so the rest was spent outside it (a slow
    ledger write, a re-fence after an ambiguous commit). That is the floor: one slow sample
    never sizes the next checkpoint below its own offsets / (2 x its commit shards), where
    an unbounded time could cut it to a handful of offsets. Offsets, not records, because
    the plan caps offsets: a transform that writes more (or fewer) records than it reads is
    accounted for.
    """
    if cp.state is not CheckpointState.COMMITTED or not cp.records:
        return None
    offsets = sum(r.end - r.start for r in cp.ranges)
    if offsets <= 0:
        return None
    timed: dict[int, tuple[int, float]] = {}  # shard -> (records, seconds), the last try's
    for event in ledger.events(cp.pipeline, cp.checkpoint_id):
        if event.kind == "publish":
            details = event.details
            timed[int(details["shard"])] = (int(details["records"]), float(details["seconds"]))
    records = min(cp.records, sum(n for n, _ in timed.values()))
    seconds = sum(min(t, timeout_s) for _, t in timed.values())
    if records <= 0 or seconds <= 0:
        return None
    counts = [n for n in cp.shard_counts.values() if n > 0]
    share = max(counts) / sum(counts) if counts else 1.0
    return offsets * (records / cp.records) / seconds, share


def measured_publish_rate(
    ledger: Ledger, pipeline_name: str, *, timeout_s: float, samples: int = RATE_SAMPLES
) -> PublishRate | None:
    """The publish rate of the pipeline's latest ``samples`` commits that published (the
    median, so one slow commit does not shrink every checkpoint); None before any.

    :param timeout_s: the pipeline's transaction timeout, the longest a shard's publish
        can count (see :func:`_publish_sample`).
    """
    rates: list[float] = []
    shares: list[float] = []
    for cp in reversed(ledger.list_checkpoints(pipeline_name, limit=2 * samples)):
        sample = _publish_sample(ledger, cp, timeout_s)
        if sample is not None:
            rates.append(sample[0])
            shares.append(sample[1])
            if len(rates) == samples:
                break
    if not rates:
        return None
    return PublishRate(statistics.median(rates), max(shares), len(rates))


def checkpoint_budget(pipeline: Pipeline, ledger: Ledger) -> CheckpointBudget:
    """The most source offsets the next checkpoint may plan so that its largest shard
    publishes within :data:`PUBLISH_TIMEOUT_SHARE` of the pipeline's
    ``transaction_timeout_ms``: measured rate x that time / the largest shard's share
    (:data:`DEFAULT_PUBLISH_RATE` and one shard taking everything until a commit is
    measured). A shard's transaction the broker would abort for its timeout can only fail
    (:class:`~airflow_provider_eo.errors.TransactionTimedOut`), so plan keeps it out of reach.
    """
    timeout_s = pipeline.transaction_timeout_ms / 1000
    rate = measured_publish_rate(ledger, pipeline.name, timeout_s=timeout_s)
    per_s = rate.offsets_per_s if rate is not None else DEFAULT_PUBLISH_RATE
    share = rate.largest_share if rate is not None else 1.0
    seconds = timeout_s * PUBLISH_TIMEOUT_SHARE
    return CheckpointBudget(max(1, int(per_s * seconds / share)), per_s, share, rate is not None)


def sized_to_transaction_timeout(ledger: Ledger, cp: CheckpointRecord) -> bool:
    """Whether the plan of ``cp`` was cut by :func:`checkpoint_budget` (more input was
    waiting than its commit could publish in time), as its plan event records."""
    return any(
        event.to_state is CheckpointState.PLANNED and "sized_to_transaction_timeout" in event.details
        for event in ledger.events(cp.pipeline, cp.checkpoint_id)
    )


def lost_ranges(
    pipeline: Pipeline, ranges: list[RangeSpec], *, clients: KafkaClients | None = None
) -> list[str]:
    """The parts of planned ranges Kafka can no longer serve, as ``topic[p]: [a, b) ...``.

    Lost: offsets below the partition's log start (retention or ``delete_records`` removed
    them), and offsets above its log end or a partition that no longer exists (the topic was
    deleted and re-created smaller). Empty ranges lose nothing.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    wanted = [r for r in ranges if r.end > r.start]
    if not wanted:
        return []
    existing = clients.partitions_of(sorted({r.topic for r in wanted}))  # a deleted topic: its error
    present = [r.key for r in wanted if r.partition in existing.get(r.topic, [])]
    log_start = clients.list_offsets(present, spec="earliest") if present else {}
    log_end = clients.list_offsets(present, spec="latest") if present else {}
    lost: list[str] = []
    for r in wanted:
        name = f"{r.topic}[{r.partition}]"
        if r.key not in log_start:
            lost.append(f"{name}: [{r.start}, {r.end}) (the partition no longer exists)")
            continue
        if r.start < log_start[r.key]:
            upto = min(log_start[r.key], r.end)
            lost.append(f"{name}: [{r.start}, {upto}) (below the log start {log_start[r.key]})")
        if r.end > log_end[r.key]:
            since = max(log_end[r.key], r.start)
            lost.append(
                f"{name}: [{since}, {r.end}) (beyond the log end {log_end[r.key]}: was the topic re-created?)"
            )
    return lost


def data_loss_error(pipeline: Pipeline, cp: CheckpointRecord, lost: list[str]) -> DataLossError:
    """The error for a PLANNED checkpoint whose ranges can no longer be read."""
    error = DataLossError(
        f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: its planned offsets can no "
        f"longer be read from Kafka: {'; '.join(lost)}. Those records are gone (data loss "
        "unless another copy exists); every prepare of this checkpoint would fail. Set "
        "on_data_loss='skip' to abort it with the skip recorded and replan from the log start, "
        f"or abort it by hand: `eo abort MODULE:ATTR {cp.checkpoint_id} --reason TEXT` "
        "(the next plan then refuses or skips the lost offsets by the same setting)."
    )
    error.checkpoint_id = cp.checkpoint_id
    return error


def resume_unfinished(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    *,
    actor: Actor | None = None,
    may_skip: bool = True,
    lost_error: Callable[[Pipeline, CheckpointRecord, list[str]], Exception] = data_loss_error,
    clients: KafkaClients | None = None,
) -> CheckpointRecord | None:
    """The one check before anything continues the unfinished checkpoint ``cp`` (a DAG
    retry, a stream restart, a backfill's next call): ``cp`` when it can still be finished;
    ``None`` when it was PLANNED over offsets Kafka no longer has and ``on_data_loss='skip'``
    (with ``may_skip``) aborted it, so the caller plans anew from the log start, recording
    the skip. Otherwise a lost range raises ``lost_error(pipeline, cp, lost)`` (default
    :func:`data_loss_error`). A PREPARED checkpoint's ranges are not looked at: its output
    is already staged. A frozen commit plan the cluster can no longer carry out is refused
    now, not at commit time (a checkpoint from before ledger revision 0002 is frozen at
    prepare or commit instead, where the staged partition count is known)."""
    clients = kafka_clients(pipeline.kafka, clients)
    if cp.state is CheckpointState.PLANNED:
        lost = lost_ranges(pipeline, list(cp.ranges), clients=clients)
        if lost:
            if not may_skip or pipeline.on_data_loss != "skip":
                raise lost_error(pipeline, cp, lost)
            abort_checkpoint(
                pipeline,
                ledger,
                cp.checkpoint_id,
                reason=f"on_data_loss='skip': planned offsets deleted before prepare: {'; '.join(lost)}",
                actor=actor,
            )
            return None
    if cp.commit_plan is not None:
        check_commit_plan(pipeline, cp, cp.commit_plan, clients=clients)
    return cp


def check_may_plan(pipeline: Pipeline, ledger: Ledger, *, clients: KafkaClients | None = None) -> None:
    """Refuse a new checkpoint of a stopped pipeline, and one the sink shows to be unsafe.

    A stopped pipeline finishes what it started but starts nothing new (the ledger's plan
    refuses it too, under the pipeline row's lock: a stop racing this read). Markers written
    by another ledger (re-created, or a second deployment with this name) are refused before
    anything is planned against them, and so is a ledger older than the sink (restored from
    a backup): markers, or the newest output when none is left.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    current = ledger.get_pipeline(pipeline.name)
    if current.stopped:
        raise PipelineStopped.of(
            pipeline.name,
            stopped_by=current.stopped_by,
            stopped_at=current.stopped_at.isoformat() if current.stopped_at else None,
            reason=current.stop_reason,
        )
    check_sink(pipeline, current, clients=clients)


def plan_checkpoint(
    pipeline: Pipeline,
    ledger: Ledger,
    *,
    actor: Actor | None = None,
    next_only: bool = False,
    clients: KafkaClients | None = None,
) -> CheckpointRecord | None:
    """Return the pipeline's unfinished checkpoint, else plan the next one.

    Idempotent per run: while a checkpoint is unfinished, every call returns it (this is
    restart-from-checkpoint). Returns ``None`` when there is nothing new to read. A stopped
    pipeline (``eo stop``) raises :class:`PipelineStopped` once nothing is unfinished.

    ``next_only=True`` (streaming mode, which pipelines checkpoints and resumes its
    unfinished ones itself) never returns an unfinished checkpoint: it plans the NEXT one,
    starting where the newest planned one ends (the ledger's partition heads move at plan
    time, so ranges stay contiguous), and the ledger refuses it past ``max_pending``
    unfinished checkpoints (InvariantViolation). A stopped pipeline raises
    :class:`PipelineStopped` even while earlier checkpoints are unfinished: they finish,
    nothing new starts.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    prefix = pinned_prefix(pipeline, ledger, where="the plan")
    unfinished = None if next_only else ledger.unfinished(pipeline.name)
    if unfinished is not None:
        # A PLANNED range retention (or a topic re-creation) took away would fail every
        # prepare: refuse it by name, or with on_data_loss='skip' abort it and plan anew.
        unfinished = resume_unfinished(pipeline, ledger, unfinished, actor=actor, clients=clients)
        if unfinished is not None:
            return unfinished
    check_may_plan(pipeline, ledger, clients=clients)
    topics = clients.partitions_of(pipeline.source_topics)
    partition_count = sink_partitions(pipeline, clients=clients)  # a missing sink fails here
    partitions = [(t, p) for t, ps in sorted(topics.items()) for p in ps]
    known = ledger.next_starts(pipeline.name)
    new = [tp for tp in partitions if tp not in known]
    starts: dict[TP, int] = {tp: known[tp] for tp in partitions if tp in known}
    log_start = clients.list_offsets(partitions, spec="earliest")
    discovered: dict[str, dict[str, int | str]] = {}
    if not known:  # the pipeline's first checkpoint (of its lineage): the startup policy
        starts.update(startup_offsets(pipeline, new, clients=clients))
    else:
        # A partition found later (the topic grew) starts from its earliest offset whatever
        # the startup policy, as in Flink: its records were all written after the pipeline
        # started, so "latest" (or a group/timestamp start) would silently skip them.
        for topic, partition in new:
            starts[(topic, partition)] = log_start[(topic, partition)]
            discovered[f"{topic}[{partition}]"] = {
                "start": log_start[(topic, partition)],
                "policy": "earliest",
            }
    # The end is the last stable offset (open transactions of a transactional input
    # are excluded), so the range never reaches into undecided records.
    ends = clients.list_offsets(partitions, spec="latest")
    skipped: dict[TP, int] = {}
    for tp in partitions:
        topic, partition = tp
        if starts[tp] > ends[tp]:
            raise SourceError(
                f"pipeline {pipeline.name!r}: {topic}[{partition}] ends at offset {ends[tp]} but "
                f"the next checkpoint must start at {starts[tp]}; was the topic deleted and "
                "recreated? Restore the pipeline from a savepoint or reset it to new offsets."
            )
        if starts[tp] < log_start[tp]:
            if pipeline.on_data_loss != "skip":
                raise DataLossError(
                    f"pipeline {pipeline.name!r}: offsets [{starts[tp]}, {log_start[tp]}) of "
                    f"{topic}[{partition}] were deleted by retention before they were read. "
                    "Nothing was planned. Set on_data_loss='skip' to continue from the log "
                    "start (the skip is recorded in the ledger), or restore the data."
                )
            skipped[tp] = starts[tp]
            starts[tp] = log_start[tp]
    budget = pipeline.max_records_per_checkpoint
    sized: CheckpointBudget | None = None
    waiting = sum(max(0, ends[tp] - starts[tp]) for tp in partitions)
    if waiting > 0:
        # Small enough that the commit's shards publish well inside transaction.timeout.ms
        # (a bigger one would be aborted by the broker every time it is committed).
        sized = checkpoint_budget(pipeline, ledger)
        budget = min(budget, sized.offsets)
    capped = cap_ranges(starts, ends, budget)
    has_data = any(capped[tp] > starts[tp] for tp in partitions)
    if not has_data and not new and not skipped:
        return None
    ranges = [
        RangeSpec(
            topic=t,
            partition=p,
            start=starts[(t, p)],
            end=capped[(t, p)],
            skipped_from=skipped.get((t, p)),
        )
        for t, p in partitions
    ]
    details: dict[str, object] = {
        "skipped": {f"{t}[{p}]": [s, starts[(t, p)]] for (t, p), s in skipped.items()}
    }
    if discovered:  # recorded with the plan's event: where each new partition started
        details["discovered"] = discovered
    if sized is not None and sized.offsets < min(waiting, pipeline.max_records_per_checkpoint):
        # Cut by the transaction timeout, not by max_records_per_checkpoint: say why.
        details["sized_to_transaction_timeout"] = {
            "offsets": sized.offsets,
            "offsets_per_s": round(sized.offsets_per_s, 1),
            "largest_shard_share": round(sized.largest_share, 3),
            "measured": sized.measured,
            "transaction_timeout_ms": pipeline.transaction_timeout_ms,
        }
        log.info(
            "pipeline %r: checkpoint capped at %d offsets (of %d waiting) so its commit publishes "
            "within %.0f%% of transaction_timeout_ms=%d at %.0f offsets/s (%s)",
            pipeline.name,
            sized.offsets,
            waiting,
            PUBLISH_TIMEOUT_SHARE * 100,
            pipeline.transaction_timeout_ms,
            sized.offsets_per_s,
            "measured" if sized.measured else "assumed until a commit is measured",
        )
    return record_planned(
        pipeline,
        ledger,
        ranges,
        prefix=prefix,
        partitions=partition_count,
        max_pending=pipeline.max_pending,
        actor=actor,
        details=details,
    )
