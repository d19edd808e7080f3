"""``eo run-once``, ``eo plan``, ``eo prepare``, ``eo commit``: the checkpoint protocol by hand."""

from __future__ import annotations

from airflow_provider_eo.cli._common import (
    CheckpointOpt,
    CommitModeOpt,
    JsonFlag,
    PipelineRef,
    checkpoint_or_unfinished,
    emit,
    load,
    opened,
)
from airflow_provider_eo.cli.errors import EXIT_STOPPED, reported


def run_once_cmd(ref: PipelineRef, commit_mode: CommitModeOpt = None, as_json: JsonFlag = False) -> None:
    """One full cycle: resume anything unfinished, else plan the next checkpoint; prepare; commit.

    Exits 3 when the pipeline is stopped and nothing is unfinished (`eo resume`)."""
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.runtime import build_runtime

    with reported(stopped=EXIT_STOPPED):
        pipeline = load(ref)
        rt = build_runtime(pipeline, commit_mode=commit_mode, app_name=f"eo-{pipeline.name}", ship=[ref])
        result = run_once(rt.pipeline, stager=rt.stager, runner=rt.runner)
    emit(result.as_dict(), as_json)


def plan_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Plan the next checkpoint (or return the unfinished one); exits 3 when the pipeline is
    stopped and nothing is unfinished (`eo resume`)."""
    from airflow_provider_eo.core.coordinator import Coordinator
    from airflow_provider_eo.ledger import Actor

    with reported(stopped=EXIT_STOPPED), opened(ref) as (pipeline, ledger):
        cp = Coordinator(pipeline, ledger, Actor.here()).plan().checkpoint
    emit(cp.summary() if cp else {"pipeline": pipeline.name, "checkpoint_id": None}, as_json)


def prepare_cmd(ref: PipelineRef, checkpoint: CheckpointOpt = None, as_json: JsonFlag = False) -> None:
    """Prepare a PLANNED checkpoint with Spark (local[*] unless the pipeline names a master)."""
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.runtime import build_runtime

    with reported(), opened(ref) as (pipeline, ledger):
        cid = checkpoint_or_unfinished(ledger, pipeline.name, checkpoint)
        rt = build_runtime(pipeline, app_name=f"eo-prepare-{pipeline.name}", ship=[ref])
        result = rt.coordinator(ledger, Actor.here()).prepare(cid, rt.stager)
    emit({**result.checkpoint.summary(), "attempt": result.attempt, "note": result.note}, as_json)


def commit_cmd(
    ref: PipelineRef,
    checkpoint: CheckpointOpt = None,
    commit_mode: CommitModeOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Publish a PREPARED checkpoint in Kafka transactions and mark it COMMITTED.

    With --json the summary names the process that published each shard ("publishers":
    shard, host, pid, records; executor and task attempt in spark mode)."""
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.runtime import build_runtime

    with reported(), opened(ref) as (pipeline, ledger):
        rt = build_runtime(pipeline, commit_mode=commit_mode, stage=False)
        cid = checkpoint_or_unfinished(ledger, pipeline.name, checkpoint)
        result = rt.coordinator(ledger, Actor.here()).commit(cid)
    emit(result.summary(), as_json)
