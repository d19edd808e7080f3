"""One full cycle of a pipeline: resume the unfinished checkpoint, else plan, prepare, commit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo.core.coordinator import Coordinator
from airflow_provider_eo.core.metrics import MetricsSink
from airflow_provider_eo.core.prepare import Stager
from airflow_provider_eo.core.shard import ShardRunner
from airflow_provider_eo.ledger import Actor, CheckpointRecord, Ledger
from airflow_provider_eo.pipeline import Pipeline


@dataclass
class CycleResult:
    """What ``run_once`` did (printed by ``eo run-once --json``)."""

    pipeline: str
    checkpoint: CheckpointRecord | None
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The checkpoint's :meth:`~CheckpointRecord.summary` plus the steps run and the time."""
        cp = self.checkpoint
        base = cp.summary() if cp else {"pipeline": self.pipeline, "checkpoint_id": None, "records": 0}
        return {**base, "steps": self.steps, "seconds": round(self.seconds, 3)}


def run_once(
    pipeline: Pipeline,
    *,
    ledger: Ledger | None = None,
    stager: Stager,
    actor: Actor | None = None,
    runner: ShardRunner | None = None,
    metrics: MetricsSink | None = None,
) -> CycleResult:
    """Resume the unfinished checkpoint (else plan the next), prepare it with ``stager``,
    commit it (its shards in this process, or through ``runner`` in spark commit mode). The
    stager's engine starts only when there is something to prepare. The prepare and the
    commit are reported to ``metrics`` (none: nowhere)."""
    started = time.monotonic()
    own = ledger is None
    ledger = ledger or Ledger(pipeline.ledger_url)
    try:
        result = CycleResult(pipeline.name, None)
        coordinator = Coordinator(pipeline, ledger, actor, runner=runner, metrics=metrics)
        planned = coordinator.plan()
        cp = planned.checkpoint
        if cp is None:
            result.steps.append("nothing new")
            return result
        result.steps.append(f"plan:{cp.checkpoint_id}:{cp.state.value}")
        if planned.step == "prepare":
            prepared = coordinator.prepare(cp.checkpoint_id, stager)
            result.steps.append(f"prepare:{prepared.records}")
        committed = coordinator.commit(cp.checkpoint_id)
        result.steps.append(f"commit:{committed.published}")
        result.checkpoint = committed.checkpoint
        return result
    finally:
        result.seconds = time.monotonic() - started
        if own:
            ledger.close()
