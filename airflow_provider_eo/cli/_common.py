"""What every ``eo`` command family shares: argument types, the stdout console, the
summary line, and loading a pipeline with its ledger."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from airflow_provider_eo.cli.errors import err
from airflow_provider_eo.errors import EoError

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import Pipeline

#: Summaries and tables; a fixed width when piped, so captured output does not wrap at 80.
out = Console(width=None if sys.stdout.isatty() else 160)

PipelineRef = Annotated[str, typer.Argument(help="MODULE:ATTR of a Pipeline, e.g. mypkg.pipes:ORDERS")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print a JSON summary.")]
CommitModeOpt = Annotated[
    str | None,
    typer.Option(
        "--commit-mode",
        help="Where the commit's shard transactions run: local (this process), spark (Spark "
        "tasks on executors: this process publishes nothing) or auto (spark on a cluster "
        "master for a large checkpoint). Default: the pipeline's commit_mode.",
    ),
]
CheckpointOpt = Annotated[int | None, typer.Option(help="Checkpoint id (default: the unfinished one).")]


def emit(summary: dict[str, Any], as_json: bool) -> None:
    """Print a command's summary: one JSON object, or ``key=value`` pairs on one line."""
    if as_json:
        print(json.dumps(summary))
    else:
        out.print(" ".join(f"[bold]{k}[/]={v}" for k, v in summary.items()), highlight=False)


def say_ledger(url: str) -> None:
    """Print which ledger this command uses (``ledger: <resolved, redacted url>``), on
    stderr so ``--json`` output stays parseable."""
    from airflow_provider_eo.ledger.urls import describe_ledger_url

    err.print(f"ledger: {describe_ledger_url(url)}", highlight=False, soft_wrap=True)


def load(ref: str) -> Pipeline:
    """Import the pipeline ``MODULE:ATTR``, read the Airflow connections it names
    (``kafka_conn_id`` / ``ledger_conn_id``: ``AIRFLOW_CONN_*`` or the configured secrets
    backend; :func:`~airflow_provider_eo.runtime.resolve_pipeline`) and say which ledger it
    uses."""
    from airflow_provider_eo.runtime import resolve_pipeline

    pipeline = resolve_pipeline(ref).pipeline
    say_ledger(pipeline.ledger_url)
    return pipeline


@contextmanager
def opened(ref: str) -> Iterator[tuple[Pipeline, Ledger]]:
    """:func:`load` the pipeline and open its ledger for the block."""
    from airflow_provider_eo.ledger import Ledger

    pipeline = load(ref)
    with Ledger(pipeline.ledger_url) as ledger:
        yield pipeline, ledger


def checkpoint_or_unfinished(ledger: Ledger, pipeline: str, checkpoint: int | None) -> int:
    """``checkpoint`` when given, else the pipeline's unfinished checkpoint's id."""
    if checkpoint is not None:
        return checkpoint
    cp = ledger.unfinished(pipeline)
    if cp is None:
        raise EoError(f"pipeline {pipeline!r} has no unfinished checkpoint; run `eo plan` first")
    return int(cp.checkpoint_id)
