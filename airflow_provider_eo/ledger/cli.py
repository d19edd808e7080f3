"""``eo`` sub-commands that read (and migrate) the ledger.

``app`` is mounted by the main CLI; ``pipelines_cmd``, ``checkpoints_cmd`` and
``upgrade_cmd`` are plain typer-ready functions it may also mount at top level.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL, ENV_LEDGER_URL, redact_url

app = typer.Typer(help="The checkpoint ledger: pipelines, checkpoints, schema.", no_args_is_help=True)

_out = Console()
_err = Console(stderr=True)

UrlOption = Annotated[
    str,
    typer.Option(
        "--ledger-url",
        envvar=ENV_LEDGER_URL,
        help=(
            f"SQLAlchemy URL of the ledger (default: ${ENV_LEDGER_URL}, else {DEFAULT_LEDGER_URL}). "
            "A relative SQLite file lives in $EO_HOME, else <checkout>/.eo, else ~/.eo."
        ),
        show_default=False,
    ),
]


def _open(url: str, *, create: bool = False) -> Any:
    from airflow_provider_eo.ledger.store import Ledger
    from airflow_provider_eo.ledger.urls import describe_ledger_url

    _err.print(f"ledger: {describe_ledger_url(url)}", highlight=False, soft_wrap=True)
    return Ledger(url, create=create)


def _fail(exc: Exception) -> None:
    _err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(1)


def pipelines_cmd(url: UrlOption = DEFAULT_LEDGER_URL) -> None:
    """List the pipelines in the ledger."""
    try:
        ledger = _open(url)
        pipelines = ledger.list_pipelines()
    except LedgerError as exc:
        _fail(exc)
        return
    from airflow_provider_eo.render import pipelines_table

    _out.print(pipelines_table(pipelines, title=f"pipelines in {redact_url(url)}"))


def checkpoints_cmd(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    url: UrlOption = DEFAULT_LEDGER_URL,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON lines instead.")] = False,
    limit: Annotated[int | None, typer.Option(help="Only the latest N checkpoints.")] = None,
) -> None:
    """Show a pipeline's checkpoints: state, lineage, records, ranges, durations."""
    try:
        records = _open(url).list_checkpoints(pipeline, limit=limit)
    except LedgerError as exc:
        _fail(exc)
        return
    if json_out:
        for r in records:
            print(json.dumps(r.summary(), sort_keys=True))
        return
    from airflow_provider_eo.render import checkpoints_table

    _out.print(checkpoints_table(records, title=f"checkpoints of {pipeline}"))


def upgrade_cmd(url: UrlOption = DEFAULT_LEDGER_URL) -> None:
    """Create or migrate the ledger schema to the version this package needs."""
    try:
        ledger = _open(url)
        before = ledger.current_revision()
        ledger.upgrade()
        after = ledger.current_revision()
    except LedgerError as exc:
        _fail(exc)
        return
    _err.print(f"ledger at {redact_url(url)}: schema {before or 'empty'} -> {after}")


app.command("pipelines")(pipelines_cmd)
app.command("checkpoints")(checkpoints_cmd)
app.command("upgrade")(upgrade_cmd)
