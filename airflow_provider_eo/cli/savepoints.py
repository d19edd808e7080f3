"""``eo savepoint create|list|delete``, ``eo restore``, ``eo reset``, ``eo stop``, ``eo resume``:
where a pipeline starts from, and whether it plans at all."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from airflow_provider_eo.cli._common import JsonFlag, PipelineRef, emit, opened
from airflow_provider_eo.cli.errors import err, fail, reported

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import CheckpointRecord, PipelineRecord

savepoint_app = typer.Typer(help="Named, retained positions of a pipeline (restore starts from them).")


class _WaitProgress:
    """Prints, on stderr, what a savepoint waits for: when it changes and every 10 s."""

    def __init__(self) -> None:
        self.last: tuple[int, str] | None = None
        self.printed_at = -1e9

    def __call__(self, cp: CheckpointRecord, waited: float, wait_s: float) -> None:
        key = (cp.checkpoint_id, cp.state.value)
        if key != self.last or waited - self.printed_at >= 10:
            err.print(
                f"waiting for checkpoint {cp.checkpoint_id} ({cp.state.value}) to finish: "
                f"{waited:.0f}s of {wait_s:.0f}s",
                highlight=False,
            )
            self.last, self.printed_at = key, waited


@savepoint_app.command("create")
def savepoint_create_cmd(
    ref: PipelineRef,
    name: Annotated[str, typer.Argument(help="Savepoint name, unique per pipeline.")],
    note: Annotated[str, typer.Option("--note", help="Free text kept with the savepoint.")] = "",
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the pipeline first (stop-with-savepoint).")
    ] = False,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the checkpoint in flight to finish.")
    ] = 600.0,
    copy_to: Annotated[
        str | None,
        typer.Option(
            "--copy-checkpoint-to",
            help="A Structured Streaming sink only: also copy the query's checkpoint location as of "
            "the savepoint's batch to this new folder (start the query from it to restore).",
        ),
    ] = None,
    checkpoint_location: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-location",
            help="The query's checkpoint location (default: the sink's checkpoint_location).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Record a savepoint at the newest COMMITTED checkpoint (waiting for the one in flight);
    for a Structured Streaming sink, at its newest COMMITTED batch."""
    from airflow_provider_eo.core.savepoint import take_savepoint
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.streaming.savepoint import load_sink, take_query_savepoint

    sink = load_sink(ref)
    if sink is not None:
        if stop:
            fail(
                f"sink {sink.name!r}: --stop is for eo's own pipelines; stop the query first "
                f"(`eo stream-stop {ref}`), then take the savepoint"
            )
        with reported(), opened(ref) as (pipeline, ledger):
            query_sp = take_query_savepoint(
                pipeline,
                ledger,
                name,
                checkpoint_location=checkpoint_location or sink.checkpoint_location,
                copy_to=copy_to,
                note=note,
                wait_s=wait,
                actor=Actor.here(),
            )
        emit(query_sp.summary(), as_json)
        return
    if copy_to or checkpoint_location:
        fail(f"{ref}: --copy-checkpoint-to and --checkpoint-location are for a KafkaExactlyOnceSink")
    with reported(), opened(ref) as (pipeline, ledger):
        sp = take_savepoint(
            pipeline,
            ledger,
            name,
            note=note,
            stop=stop,
            wait_s=wait,
            actor=Actor.here(),
            progress=_WaitProgress(),
        )
    emit(sp.summary(), as_json)
    if stop and not as_json:
        err.print("the pipeline is stopped; `eo resume MODULE:ATTR` lets it plan again")


@savepoint_app.command("list")
def savepoint_list_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """The pipeline's savepoints, oldest first."""
    with reported(), opened(ref) as (pipeline, ledger):
        sps = ledger.list_savepoints(pipeline.name)
    if as_json:
        print(json.dumps([sp.summary() for sp in sps]))
        return
    from airflow_provider_eo.render import console, savepoints_table

    console.print(savepoints_table(sps))


@savepoint_app.command("delete")
def savepoint_delete_cmd(
    ref: PipelineRef, name: Annotated[str, typer.Argument(help="The savepoint to delete.")]
) -> None:
    """Delete a savepoint (the event log keeps what it held)."""
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        sp = ledger.delete_savepoint(pipeline.name, name, actor=Actor.here())
    err.print(f"deleted savepoint {sp.name!r} of pipeline {sp.pipeline!r}", highlight=False)


def restore_cmd(
    ref: PipelineRef,
    savepoint: Annotated[str, typer.Option("--savepoint", help="Name of the savepoint to start from.")],
    allow_non_restored: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored",
            help="Drop partitions that no longer exist; start partitions the savepoint lacks from earliest.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a new lineage at a savepoint's offsets (what follows is processed again)."""
    from airflow_provider_eo.core.restore import restore_from_savepoint
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        result = restore_from_savepoint(
            pipeline, ledger, savepoint, allow_non_restored=allow_non_restored, actor=Actor.here()
        )
    emit(result.summary(), as_json)


def reset_cmd(
    ref: PipelineRef,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="earliest | latest | timestamp=<ISO-8601> | offsets=<JSON {topic: {partition: offset}}>",
        ),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Start a new lineage at earliest, latest, a timestamp or given offsets."""
    from airflow_provider_eo.core.restore import reset_pipeline
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        result = reset_pipeline(pipeline, ledger, to, actor=Actor.here())
    emit(result.summary(), as_json)


def _stop_line(p: PipelineRecord) -> dict[str, Any]:
    return {
        "pipeline": p.name,
        "stopped": p.stopped,
        "stopped_by": p.stopped_by,
        "stopped_at": p.stopped_at.isoformat() if p.stopped_at else None,
        "reason": p.stop_reason,
    }


def stop_cmd(
    ref: PipelineRef,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the ledger).")] = "eo stop",
    as_json: JsonFlag = False,
) -> None:
    """Stop planning new checkpoints (the unfinished one still finishes)."""
    from airflow_provider_eo.core.savepoint import stop_pipeline
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        p = stop_pipeline(pipeline, ledger, reason=reason, actor=Actor.here())
    emit(_stop_line(p), as_json)


def resume_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Clear a stop: plan starts new checkpoints again."""
    from airflow_provider_eo.core.savepoint import resume_pipeline
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        p = resume_pipeline(pipeline, ledger, actor=Actor.here())
    emit(_stop_line(p), as_json)
