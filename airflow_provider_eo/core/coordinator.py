"""One checkpoint coordinator: plan -> prepare -> commit of one pipeline, for every caller.

A :class:`Coordinator` belongs to one (pipeline, ledger, actor). Each entry point that moves
checkpoints (``run_once``, a backfill, the stream's steps, the Structured Streaming sink's
batch) is a short loop over it:

1. ``plan(source)``: the :class:`RangeSource` says where the ranges come from (the live
   offsets, :class:`LiveOffsets`; a backfill's stored ranges,
   :class:`~airflow_provider_eo.core.backfill.BackfillRequest`; a Structured Streaming offset
   log, :class:`~airflow_provider_eo.core.batches.OffsetLog`) and returns a
   :class:`Planned`: the checkpoint and the step it needs next (:func:`next_step`, pure).
2. ``prepare(checkpoint_id, stager)``: stage it (core/prepare.py), or ``prepare_with`` a
   function that prepares elsewhere (a spark-submit).
3. ``commit(checkpoint_id)``: publish it (core/commit.py) through the coordinator's shard
   runner, the same for every caller (the entry points resolve it with one function:
   spark/commit.py's ``resolve_runner``).

Each step tells the :class:`CheckpointListener` objects (planned, prepared, committed,
failed); with a :class:`~airflow_provider_eo.core.metrics.MetricsSink` the
:class:`MetricsListener` is one of them, so every path sends the same metrics. A listener
never changes a step's outcome: its failure is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from airflow_provider_eo.core.commit import CommitResult, commit_checkpoint
from airflow_provider_eo.core.kafka_clients import kafka_clients
from airflow_provider_eo.core.metrics import MetricsSink, PipelineMetrics
from airflow_provider_eo.core.plan import plan_checkpoint
from airflow_provider_eo.core.prepare import PrepareResult, Stager, prepare_checkpoint
from airflow_provider_eo.core.shard import KafkaClients, ShardRunner
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a planned checkpoint needs next: nothing to plan, stage it then commit it, commit its
#: staged output, or nothing (published already).
Step = Literal["nothing", "prepare", "commit", "skip"]


def next_step(cp: CheckpointRecord | None) -> Step:
    """The step checkpoint ``cp`` needs (pure): none planned -> ``nothing``; PLANNED ->
    ``prepare`` (then commit); PREPARED -> ``commit``; COMMITTED -> ``skip``. An ABORTED
    checkpoint is never handed on by a plan: ValueError."""
    if cp is None:
        return "nothing"
    if cp.state is CheckpointState.PLANNED:
        return "prepare"
    if cp.state is CheckpointState.PREPARED:
        return "commit"
    if cp.state is CheckpointState.COMMITTED:
        return "skip"
    raise ValueError(f"checkpoint {cp.checkpoint_id} is {cp.state.value}: no step continues it")


@dataclass(frozen=True)
class Planned:
    """What a plan returned: the checkpoint to carry on (None: nothing new), the step it
    needs and why (a range source's reason, for logs)."""

    checkpoint: CheckpointRecord | None
    step: Step
    reason: str = ""

    @classmethod
    def of(cls, cp: CheckpointRecord | None, reason: str = "") -> Planned:
        """``cp`` with the step its state calls for (:func:`next_step`)."""
        return cls(cp, next_step(cp), reason)


class RangeSource(Protocol):
    """Where a checkpoint's ranges come from. ``plan`` returns the unfinished checkpoint it
    resumes or the one it recorded PLANNED (every refusal before the ledger is written)."""

    def plan(self, pipeline: Pipeline, ledger: Ledger, actor: Actor, clients: KafkaClients) -> Planned:
        """Resume or plan the next checkpoint of ``pipeline``, reading Kafka through
        ``clients``."""
        ...


@dataclass(frozen=True)
class LiveOffsets:
    """The live source offsets (core/plan.py): the unfinished checkpoint, else the next
    ranges from where the ledger's last checkpoint ended to the last stable offsets.
    ``next_only``: never the unfinished one (the stream resumes those itself)."""

    next_only: bool = False

    def plan(
        self, pipeline: Pipeline, ledger: Ledger, actor: Actor, clients: KafkaClients | None = None
    ) -> Planned:
        """:func:`~airflow_provider_eo.core.plan.plan_checkpoint`."""
        clients = kafka_clients(pipeline.kafka, clients)
        return Planned.of(
            plan_checkpoint(pipeline, ledger, actor=actor, next_only=self.next_only, clients=clients)
        )


class CheckpointListener(Protocol):
    """Told of each step's outcome (metrics, notifications). ``seconds`` is ``None`` when
    nothing was measured (the step had been done already). A listener may raise: the
    coordinator logs it and goes on."""

    def planned(self, cp: CheckpointRecord) -> None:
        """``cp`` was planned or resumed."""
        ...

    def prepared(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """``cp`` is PREPARED (by this call when ``seconds`` is given)."""
        ...

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """``cp`` was just made COMMITTED by this coordinator (a repeated commit, or one
        finished by another committer, is not reported)."""
        ...

    def failed(self, step: str, checkpoint_id: int | None, error: BaseException) -> None:
        """``step`` (plan, prepare, commit) of ``checkpoint_id`` raised ``error`` (re-raised
        to the caller after the listeners)."""
        ...


class MetricsListener:
    """The protocol's metrics (core/metrics.py) from the coordinator's steps: prepare
    seconds; committed records, dead letters, commit seconds and the lag left after each
    commit (one bounded Kafka call)."""

    def __init__(
        self, sink: MetricsSink | None, pipeline: Pipeline, clients: KafkaClients | None = None
    ) -> None:
        clients = kafka_clients(pipeline.kafka, clients)
        self.report = PipelineMetrics(sink, pipeline.name)
        self.kafka: Mapping[str, Any] = pipeline.kafka
        self.clients = clients

    def planned(self, cp: CheckpointRecord) -> None:
        """Nothing is measured at plan time."""

    def prepared(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """:data:`~airflow_provider_eo.core.metrics.PREPARE_SECONDS` when measured."""
        if seconds is not None:
            self.report.prepared(seconds)

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """Records, dead letters, commit seconds, then the lag."""
        self.report.committed(cp, seconds)
        self.report.lag_after(self.kafka, cp, self.clients)

    def failed(self, step: str, checkpoint_id: int | None, error: BaseException) -> None:
        """A failure is the caller's to report (an abort has its own counter)."""


class Coordinator:
    """Plan, prepare and commit the checkpoints of one pipeline (see the module docstring).

    :param pipeline: the pipeline, its connections applied.
    :param ledger: its ledger (the caller owns it).
    :param actor: who acts (recorded with every step).
    :param runner: where a spark-mode commit runs its shards (``resolve_runner``); None:
        in this process.
    :param fallback: commit a spark-mode checkpoint here when the runner cannot run, telling
        this callable why in one line (None: such a commit fails).
    :param clients: the Kafka side of the commit (unit tests pass a fake).
    :param metrics: where the metrics go (a :class:`MetricsListener` is attached); None: nowhere.
    :param listeners: more listeners, told after the metrics one.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        ledger: Ledger,
        actor: Actor | None = None,
        *,
        runner: ShardRunner | None = None,
        fallback: Callable[[str], None] | None = None,
        clients: KafkaClients | None = None,
        metrics: MetricsSink | None = None,
        listeners: Iterable[CheckpointListener] = (),
    ) -> None:
        clients = kafka_clients(pipeline.kafka, clients)
        self.pipeline = pipeline
        self.ledger = ledger
        self.actor = actor or Actor.here()
        self.runner = runner
        self.fallback = fallback
        self.clients = clients
        self.listeners: list[CheckpointListener] = [
            *([MetricsListener(metrics, pipeline, clients)] if metrics is not None else []),
            *listeners,
        ]

    def _tell(self, event: str, *args: Any) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, event)(*args)
            except Exception as exc:  # a listener is never worth a failed step
                log.warning(
                    "pipeline %s: listener %s.%s failed: %s: %s",
                    self.pipeline.name,
                    type(listener).__name__,
                    event,
                    type(exc).__name__,
                    exc,
                )

    def plan(self, source: RangeSource | None = None) -> Planned:
        """Resume or plan the next checkpoint from ``source`` (default: :class:`LiveOffsets`)."""
        try:
            planned = (source or LiveOffsets()).plan(self.pipeline, self.ledger, self.actor, self.clients)
        except BaseException as exc:
            self._tell("failed", "plan", None, exc)
            raise
        if planned.checkpoint is not None:
            self._tell("planned", planned.checkpoint)
        return planned

    def prepare(self, checkpoint_id: int, stager: Stager, *, attempt: str | None = None) -> PrepareResult:
        """Stage a PLANNED checkpoint with ``stager`` and make it PREPARED (idempotent:
        a PREPARED or COMMITTED one is returned as it is, nothing measured). ``attempt``:
        the attempt's name (default: a fresh one)."""
        try:
            result = prepare_checkpoint(
                self.pipeline,
                self.ledger,
                checkpoint_id,
                stager=stager,
                attempt=attempt,
                actor=self.actor,
                clients=self.clients,
            )
        except BaseException as exc:
            self._tell("failed", "prepare", checkpoint_id, exc)
            raise
        self._tell("prepared", result.checkpoint, result.seconds if result.attempt is not None else None)
        return result

    def prepare_with(self, checkpoint_id: int, prepare: Callable[[int], object]) -> CheckpointRecord:
        """Prepare a PLANNED checkpoint by ``prepare(checkpoint_id)`` (a spark-submit, or any
        prepare that runs elsewhere) and return it as the ledger now has it. Listeners are told
        it is PREPARED with no time: the process that staged it measured (and reports) that."""
        try:
            prepare(checkpoint_id)
            cp = self.ledger.get(self.pipeline.name, checkpoint_id)
        except BaseException as exc:
            self._tell("failed", "prepare", checkpoint_id, exc)
            raise
        self._tell("prepared", cp, None)
        return cp

    def commit(
        self, checkpoint_id: int, *, runner: ShardRunner | None = None, commit_mode: str | None = None
    ) -> CommitResult:
        """Publish a PREPARED checkpoint and make it COMMITTED (core/commit.py; committing a
        COMMITTED checkpoint does nothing), through ``runner`` (default: the coordinator's).
        ``commit_mode``: ``local`` commits in this process whatever the pipeline says (a caller
        that chose where to commit); None: the pipeline's mode."""
        try:
            result = commit_checkpoint(
                self.pipeline,
                self.ledger,
                checkpoint_id,
                actor=self.actor,
                clients=self.clients,
                commit_mode=commit_mode,
                runner=runner or self.runner,
                fallback=self.fallback,
            )
        except BaseException as exc:
            self._tell("failed", "commit", checkpoint_id, exc)
            raise
        if committed_here(result):
            self._tell("committed", result.checkpoint, result.seconds)
        return result

    def commit_with(self, checkpoint_id: int, commit: Callable[[int], T]) -> tuple[CheckpointRecord, T]:
        """Commit a checkpoint by ``commit(checkpoint_id)`` (a spark-submit of the commit
        application, or any commit that runs elsewhere) and return it as the ledger now has
        it, with what ``commit`` returned. Listeners are told it is COMMITTED, with the
        call's time, when the ledger shows it moved to COMMITTED during the call; the caller
        decides what a call that left it uncommitted means (it is not a failure here)."""
        started = time.monotonic()
        try:
            before = self.ledger.get(self.pipeline.name, checkpoint_id).state
            returned = commit(checkpoint_id)
            cp = self.ledger.get(self.pipeline.name, checkpoint_id)
        except BaseException as exc:
            self._tell("failed", "commit", checkpoint_id, exc)
            raise
        if before is not CheckpointState.COMMITTED and cp.state is CheckpointState.COMMITTED:
            self._tell("committed", cp, time.monotonic() - started)
        return cp, returned

    def finish(self, planned: Planned, prepare: Callable[[int], object] | None = None) -> CommitResult | None:
        """Carry ``planned`` to COMMITTED: prepare it by ``prepare`` when its step is
        ``prepare`` (a stager's prepare is ``lambda cid: coordinator.prepare(cid, stager)``),
        then commit. None when there is nothing to do (``nothing`` or ``skip``)."""
        cp = planned.checkpoint
        if cp is None or planned.step in ("nothing", "skip"):
            return None
        if planned.step == "prepare":
            if prepare is None:
                raise ValueError(f"checkpoint {cp.checkpoint_id} is PLANNED and no prepare was given")
            prepare(cp.checkpoint_id)
        return self.commit(cp.checkpoint_id)


def committed_here(result: CommitResult) -> bool:
    """Whether this commit call made the checkpoint COMMITTED (not a repeat, not finished by
    another committer meanwhile)."""
    return (
        result.checkpoint.state is CheckpointState.COMMITTED
        and result.note != "already COMMITTED"
        and not result.by_another
    )
