"""``eo backfill``: re-process a committed time range into another sink topic, exactly once."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from airflow_provider_eo.cli._common import JsonFlag, PipelineRef, emit, opened
from airflow_provider_eo.cli.errors import err, fail, reported

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import CheckpointRecord


def backfill_cmd(
    ref: PipelineRef,
    start: Annotated[str, typer.Option("--start", help="Start, ISO-8601 (inclusive; UTC if no zone).")],
    end: Annotated[str, typer.Option("--end", help="Interval end, ISO-8601 (exclusive; UTC if no zone).")],
    sink_topic: Annotated[str, typer.Option("--sink-topic", help="The backfill's own sink topic.")],
    transform: Annotated[
        str | None, typer.Option("--transform", help="MOD:FN instead of the pipeline's transform.")
    ] = None,
    allow_live_sink: Annotated[
        bool,
        typer.Option("--allow-live-sink", help="Allow the live pipeline's sink as the target (duplicates)."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Re-process the records with a Kafka timestamp in [START, END) that the pipeline
    committed, into SINK_TOPIC, exactly once (a rerun adds nothing)."""
    from airflow_provider_eo.core.backfill import (
        BackfillRequest,
        iso_ms,
        local_prepare,
        parse_instant,
        run_backfill,
    )
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.runtime import build_runtime

    try:
        start_ms, end_ms = parse_instant(start), parse_instant(end)
    except ValueError as exc:
        fail(f"{exc}; pass --start and --end as ISO-8601, e.g. 2024-05-01T00:00:00Z")

    def progress(cp: CheckpointRecord) -> None:
        window = " - ".join(iso_ms(x) for x in cp.time_filter) if cp.time_filter else "?"
        ranges = " ".join(r.compact() for r in cp.ranges)
        err.print(
            f"checkpoint {cp.checkpoint_id} committed: {cp.records} records [{window}) {ranges}",
            highlight=False,
            soft_wrap=True,
        )

    with reported(), opened(ref) as (pipeline, ledger):
        rt = build_runtime(pipeline, ship=[ref])
        request = BackfillRequest(pipeline, start_ms, end_ms, sink_topic, transform, allow_live_sink)
        result = run_backfill(
            request,
            ledger,
            actor=Actor.here(),
            prepare=local_prepare(rt.stager),
            progress=progress,
            runner=rt.runner,
            say=lambda line: err.print(line, highlight=False, soft_wrap=True),
        )
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        summary.pop("details")
        emit(summary, False)
