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
    with_commit_mode,
)
from airflow_provider_eo.cli.errors import EXIT_STOPPED, reported


def run_once_cmd(ref: PipelineRef, commit_mode: CommitModeOpt = None, as_json: JsonFlag = False) -> None:
    """One full cycle: resume anything unfinished, else plan the next checkpoint; prepare; commit.

    Exits 3 when the pipeline is stopped and nothing is unfinished (`eo resume`)."""
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.spark.commit import resolve_runner
    from airflow_provider_eo.spark.stager import SparkStager

    with reported(stopped=EXIT_STOPPED):
        pipeline = with_commit_mode(load(ref), commit_mode)
        stager = SparkStager(app_name=f"eo-{pipeline.name}", ship=[ref])
        result = run_once(pipeline, stager=stager, runner=resolve_runner(pipeline))
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
    from airflow_provider_eo.core.coordinator import Coordinator
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.spark.stager import SparkStager

    with reported(), opened(ref) as (pipeline, ledger):
        cid = checkpoint_or_unfinished(ledger, pipeline.name, checkpoint)
        stager = SparkStager(app_name=f"eo-prepare-{pipeline.name}", ship=[ref])
        result = Coordinator(pipeline, ledger, Actor.here()).prepare(cid, stager)
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
    from airflow_provider_eo.core.coordinator import Coordinator
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.spark.commit import resolve_runner

    with reported(), opened(ref) as (pipeline, ledger):
        pipeline = with_commit_mode(pipeline, commit_mode)
        cid = checkpoint_or_unfinished(ledger, pipeline.name, checkpoint)
        coordinator = Coordinator(pipeline, ledger, Actor.here(), runner=resolve_runner(pipeline))
        result = coordinator.commit(cid)
    emit(result.summary(), as_json)
