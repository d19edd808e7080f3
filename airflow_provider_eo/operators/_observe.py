"""What an operator reports when a checkpoint changes state: metrics through Airflow's
``Stats`` (:mod:`airflow_provider_eo.metrics`) and the pipeline's notifiers
(:mod:`airflow_provider_eo.notify`). One call per moment, so each operator adds one line;
nothing here changes a task's outcome (failures are logged)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from airflow_provider_eo.errors import StagingError
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState
from airflow_provider_eo.metrics import pipeline_metrics
from airflow_provider_eo.notify import notify, notify_committed, notify_refusals
from airflow_provider_eo.operators.base import open_ledger
from airflow_provider_eo.pipeline import Pipeline

log = logging.getLogger(__name__)


def committed(context: Mapping[str, Any], pipeline: Pipeline, checkpoint_id: int, seconds: float) -> None:
    """The checkpoint was made COMMITTED by this try in ``seconds``: records, dead letters,
    commit time, the lag left over the partitions it read (read from the ledger now);
    ``dead_letters`` notified when over the pipeline's threshold."""
    try:
        with open_ledger(pipeline) as ledger:
            cp = ledger.get(pipeline.name, checkpoint_id)
    except Exception as exc:
        log.warning("pipeline %s: checkpoint %s not reported: %s", pipeline.name, checkpoint_id, exc)
        return
    metrics = pipeline_metrics(pipeline.name)
    metrics.committed(cp, seconds)
    metrics.lag_after(pipeline.kafka, cp)
    notify_committed(pipeline, context, cp)


def aborted(context: Mapping[str, Any], pipeline: Pipeline, cp: CheckpointRecord) -> None:
    """``cp`` was aborted by this try: ``eo.checkpoint.aborted`` and ``checkpoint_aborted``."""
    pipeline_metrics(pipeline.name).aborted()
    notify(
        pipeline,
        "checkpoint_aborted",
        context,
        checkpoint_id=cp.checkpoint_id,
        reason=cp.abort_reason or "",
        records=cp.records,
    )


def stream_lost(context: Mapping[str, Any], pipeline: Pipeline, run: Mapping[str, Any], reason: str) -> None:
    """A streaming driver's run went silent (LOST): ``stream_stalled``."""
    notify(
        pipeline,
        "stream_stalled",
        context,
        reason=reason,
        stream_run_id=run.get("run_id"),
        host=run.get("host"),
        pid=run.get("pid"),
        log_path=run.get("log_path"),
    )


@contextmanager
def commit_refusals(context: Mapping[str, Any], pipeline: Pipeline, checkpoint_id: int) -> Iterator[None]:
    """Around a commit in this process: a data-loss refusal notifies ``data_loss``; a
    verified staging mismatch, which aborts the checkpoint (core/commit.py), reports the
    abort. The error propagates unchanged."""
    try:
        with notify_refusals(pipeline, context, checkpoint_id=checkpoint_id):
            yield
    except StagingError:
        try:
            with open_ledger(pipeline) as ledger:
                cp = ledger.get(pipeline.name, checkpoint_id)
        except Exception as exc:
            log.warning("pipeline %s: checkpoint %s not reported: %s", pipeline.name, checkpoint_id, exc)
            raise
        if cp.state is CheckpointState.ABORTED:
            aborted(context, pipeline, cp)
        raise
