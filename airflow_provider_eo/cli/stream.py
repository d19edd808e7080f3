"""``eo stream`` and ``eo stream-stop``: streaming mode from a shell."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, cast

import typer

from airflow_provider_eo.cli._common import (
    CommitModeOpt,
    JsonFlag,
    PipelineRef,
    emit,
    load,
    opened,
)
from airflow_provider_eo.cli.errors import fail, reported

if TYPE_CHECKING:
    from airflow_provider_eo.core.stream import StreamCheckpoint
    from airflow_provider_eo.core.stream_contract import CommitMode


def stream_cmd(
    ref: PipelineRef,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between checkpoints (plan, prepare, hand on).")
    ] = 5.0,
    commit: Annotated[
        str,
        typer.Option(
            "--commit",
            help="inline: this process commits each prepared checkpoint; airflow: it only "
            "prepares (the Airflow commit operator commits), still bounded by max_pending.",
        ),
    ] = "inline",
    duration: Annotated[
        float | None, typer.Option("--duration", help="Stop cleanly after this many seconds.")
    ] = None,
    checkpoints: Annotated[
        int | None, typer.Option("--checkpoints", help="Stop cleanly after this many checkpoints.")
    ] = None,
    heartbeat: Annotated[
        float,
        typer.Option(
            "--heartbeat",
            help="Seconds between the run's heartbeats in the ledger (a run silent for 4 "
            "heartbeats counts as lost).",
        ),
    ] = 5.0,
    commit_mode: CommitModeOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Streaming mode: one Spark session plans, prepares and commits a checkpoint every
    --interval seconds (prepare of the next overlaps the commit of the last) until SIGTERM,
    --duration or --checkpoints; prints one line per checkpoint and a summary on exit.

    SIGTERM/SIGINT finish the in-flight checkpoints and exit 0; a restart resumes whatever a
    killed run left. A stopped pipeline (`eo stop`) ends the stream cleanly too."""
    from airflow_provider_eo.core.stream import run_stream
    from airflow_provider_eo.core.stream_contract import StreamAppArgs

    with reported():
        app = StreamAppArgs(
            pipeline=ref,
            interval=interval,
            commit=cast("CommitMode", commit),
            duration=duration,
            checkpoints=checkpoints,
            heartbeat=heartbeat,
        ).validate()

    def line(cp: StreamCheckpoint) -> None:
        summary = cp.summary()
        if as_json:
            print(json.dumps(summary), flush=True)
        else:
            print(" ".join(f"{k}={'-' if v is None else v}" for k, v in summary.items()), flush=True)

    from airflow_provider_eo.runtime import build_runtime

    with reported():
        pipeline = load(app.pipeline)
        rt = build_runtime(
            pipeline, commit_mode=commit_mode, app_name=f"eo-stream-{pipeline.name}", ship=[app.pipeline]
        )
        result = run_stream(
            rt.pipeline,
            interval_s=app.interval,
            commit=app.commit,
            duration_s=app.duration,
            max_checkpoints=app.checkpoints,
            on_checkpoint=line,
            heartbeat_s=app.heartbeat,
            stager=rt.stager,
            runner=rt.runner,
        )
    summary = result.summary()
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        print("stream: " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)


def stream_stop_cmd(
    ref: PipelineRef,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Only this run (default: every running one).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ask the pipeline's running streaming application to stop cleanly (as SIGTERM does:
    in-flight checkpoints finish), from any host that reaches the ledger. It stops at its
    next heartbeat; `eo stream` / the Airflow task then ends with reason `stop requested`."""
    from airflow_provider_eo.ledger import Actor

    with reported(), opened(ref) as (pipeline, ledger):
        asked = list(
            ledger.request_stream_stop(pipeline.name, requested_by=Actor.here().label(), run_id=run_id)
        )
    if not asked:
        fail(f"no running streaming application{f' with run id {run_id}' if run_id else ''} in the ledger")
    emit({"stop_requested": asked}, as_json)
