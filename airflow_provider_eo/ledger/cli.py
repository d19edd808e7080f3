"""``eo`` sub-commands that read (and migrate) the ledger.

``app`` is mounted by the main CLI; ``pipelines_cmd``, ``checkpoints_cmd`` and
``upgrade_cmd`` are plain typer-ready functions it may also mount at top level.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.records import CheckpointRecord
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


def _duration(start: dt.datetime | None, end: dt.datetime | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = (end - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"


_STATE_STYLE = {"PLANNED": "cyan", "PREPARED": "yellow", "COMMITTED": "green", "ABORTED": "red"}


def render_checkpoints_table(records: Sequence[CheckpointRecord], *, title: str | None = None) -> Table:
    """A rich table of checkpoints: id, state, lineage, records, ranges, durations."""
    table = Table(title=title, header_style="bold")
    table.add_column("id", justify="right")
    table.add_column("state")
    table.add_column("lineage", justify="right")
    table.add_column("records", justify="right")
    table.add_column("ranges")
    table.add_column("plan→prepare", justify="right")
    table.add_column("prepare→commit", justify="right")
    for r in records:
        style = _STATE_STYLE.get(r.state.value, "")
        table.add_row(
            str(r.checkpoint_id),
            f"[{style}]{r.state.value}[/]" if style else r.state.value,
            str(r.lineage),
            "-" if r.records is None else str(r.records),
            ", ".join(rg.compact() for rg in r.ranges),
            _duration(r.planned_at, r.prepared_at),
            _duration(r.prepared_at, r.committed_at),
        )
    return table


def pipelines_cmd(url: UrlOption = DEFAULT_LEDGER_URL) -> None:
    """List the pipelines in the ledger."""
    try:
        ledger = _open(url)
        pipelines = ledger.list_pipelines()
    except LedgerError as exc:
        _fail(exc)
        return
    table = Table(title=f"pipelines in {redact_url(url)}", header_style="bold")
    for col in ("name", "lineage", "last checkpoint", "fingerprint", "updated"):
        table.add_column(col)
    for p in pipelines:
        table.add_row(
            p.name,
            str(p.current_lineage),
            str(p.last_checkpoint_id),
            p.fingerprint,
            p.updated_at.isoformat(timespec="seconds"),
        )
    _out.print(table)


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
    _out.print(render_checkpoints_table(records, title=f"checkpoints of {pipeline}"))


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
