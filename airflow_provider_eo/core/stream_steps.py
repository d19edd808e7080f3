"""A stream's steps and what it reports: the checkpoints it finished (:class:`StreamResult`)
and the plan / prepare / commit calls it drives (:class:`StreamSteps`, :func:`default_steps`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo.core.coordinator import Coordinator, LiveOffsets
from airflow_provider_eo.core.metrics import MetricsSink
from airflow_provider_eo.core.prepare import Stager
from airflow_provider_eo.core.shard import ShardRunner
from airflow_provider_eo.core.stream_contract import CommitMode
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline


@dataclass(frozen=True)
class StreamCheckpoint:
    """One checkpoint the stream carried: prepared here (or resumed) and, inline, committed."""

    checkpoint_id: int
    records: int
    prepare_s: float | None  # None: it was PREPARED already (resumed)
    commit_s: float | None  # None: left to Airflow (commit="airflow")
    state: str
    resumed: bool = False
    planned_at: float = 0.0  # time.time() when planned (or resumed)
    done_at: float = 0.0  # time.time() when committed (inline) or prepared (airflow)

    def summary(self) -> dict[str, Any]:
        """The per-checkpoint line of ``eo stream`` (id, records, prepare and commit time)."""
        return {
            "checkpoint": self.checkpoint_id,
            "records": self.records,
            "prepare_s": None if self.prepare_s is None else round(self.prepare_s, 3),
            "commit_s": None if self.commit_s is None else round(self.commit_s, 3),
            "state": self.state,
            **({"resumed": True} if self.resumed else {}),
        }


@dataclass
class StreamResult:
    """What one ``run_stream`` did (the summary ``eo stream`` prints on exit)."""

    pipeline: str
    commit: CommitMode
    checkpoints: list[StreamCheckpoint] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    backpressure_waits: int = 0  # intervals skipped because max_pending were unfinished
    empty_intervals: int = 0  # intervals with nothing new to read
    unfinished: list[int] = field(default_factory=list)  # left PLANNED/PREPARED on exit
    run_id: str | None = None  # the run's row in the ledger (eo_stream_runs)

    @property
    def records(self) -> int:
        """Records of every checkpoint carried."""
        return sum(c.records for c in self.checkpoints)

    def summary(self) -> dict[str, Any]:
        """``checkpoints`` (count), ``records`` and the rest, JSON-ready."""
        return {
            "pipeline": self.pipeline,
            "commit": self.commit,
            "checkpoints": len(self.checkpoints),
            "records": self.records,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "backpressure_waits": self.backpressure_waits,
            "empty_intervals": self.empty_intervals,
            "unfinished": self.unfinished,
            **({"run_id": self.run_id} if self.run_id else {}),
        }


@dataclass
class StreamSteps:
    """The protocol steps the stream drives (real ones by :func:`default_steps`; unit tests
    pass fakes). ``plan_next`` plans the next checkpoint even while earlier ones are
    unfinished (``None``: nothing new); ``prepare`` returns (records, seconds); ``commit``
    returns seconds; ``unfinished`` lists the PLANNED/PREPARED checkpoints in id order;
    ``state`` reads one checkpoint's state; ``full`` tells whether a plan was cut (by the
    pipeline's ``max_records_per_checkpoint``, or to a size whose commit fits the transaction
    timeout): more input is waiting."""

    plan_next: Callable[[], CheckpointRecord | None]
    prepare: Callable[[int], tuple[int, float]]
    commit: Callable[[int], float]
    unfinished: Callable[[], list[CheckpointRecord]]
    state: Callable[[int], CheckpointState]
    resume_planned: Callable[[CheckpointRecord], CheckpointRecord | None] = lambda cp: cp
    full: Callable[[CheckpointRecord], bool] = lambda cp: False


def unfinished_checkpoints(ledger: Ledger, pipeline: str) -> list[CheckpointRecord]:
    """Every PLANNED/PREPARED checkpoint of ``pipeline``, lowest id first, with its ranges.

    One read of those checkpoints only (an index holds just them), so a start costs the same
    after a million finished checkpoints as after ten.
    """
    return ledger.unfinished_checkpoints(pipeline)


def default_steps(
    pipeline: Pipeline,
    ledger: Ledger,
    stager: Stager,
    actor: Actor,
    runner: ShardRunner | None = None,
    metrics: MetricsSink | None = None,
) -> StreamSteps:
    """The real steps over one :class:`~airflow_provider_eo.core.coordinator.Coordinator`:
    plan the live offsets (next_only), prepare with ``stager``, commit (through ``runner`` in
    spark commit mode: the commit of N runs as Spark jobs while N+1 prepares). Each prepare
    and each commit that finishes a checkpoint is reported to ``metrics``
    (:mod:`airflow_provider_eo.core.metrics`)."""
    from airflow_provider_eo.core.plan import resume_unfinished, sized_to_transaction_timeout

    coordinator = Coordinator(pipeline, ledger, actor, runner=runner, metrics=metrics)
    source = LiveOffsets(next_only=True)

    def prepare(cid: int) -> tuple[int, float]:
        result = coordinator.prepare(cid, stager)
        return result.records, result.seconds

    return StreamSteps(
        plan_next=lambda: coordinator.plan(source).checkpoint,
        prepare=prepare,
        commit=lambda cid: coordinator.commit(cid).seconds,
        unfinished=lambda: unfinished_checkpoints(ledger, pipeline.name),
        state=lambda cid: ledger.get(pipeline.name, cid).state,
        resume_planned=lambda cp: resume_unfinished(pipeline, ledger, cp, actor=actor),
        full=lambda cp: (
            planned_records(cp) >= pipeline.max_records_per_checkpoint
            or sized_to_transaction_timeout(ledger, cp)
        ),
    )


def planned_records(cp: CheckpointRecord) -> int:
    """How many offsets ``cp`` plans to read (all its ranges)."""
    return sum(r.end - r.start for r in cp.ranges)
