"""``eo pipelines``, ``eo checkpoints``, ``eo ledger upgrade``: read (and migrate) a ledger
by its URL, without a pipeline definition."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from airflow_provider_eo.cli.errors import err, reported
from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL, ENV_LEDGER_URL, redact_url

if TYPE_CHECKING:
    from airflow_provider_eo.ledger import Ledger

ledger_app = typer.Typer(help="The checkpoint ledger's schema.", no_args_is_help=True)

#: Tables at the terminal's width (80 columns when piped).
_out = Console()

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


def _open(url: str) -> Ledger:
    from airflow_provider_eo.ledger.store import Ledger
    from airflow_provider_eo.ledger.urls import describe_ledger_url

    err.print(f"ledger: {describe_ledger_url(url)}", highlight=False, soft_wrap=True)
    return Ledger(url, create=False)


def pipelines_cmd(url: UrlOption = DEFAULT_LEDGER_URL) -> None:
    """List the pipelines in the ledger."""
    with reported(LedgerError):
        pipelines = _open(url).list_pipelines()
    from airflow_provider_eo.render import pipelines_table

    _out.print(pipelines_table(pipelines, title=f"pipelines in {redact_url(url)}"))


def checkpoints_cmd(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    url: UrlOption = DEFAULT_LEDGER_URL,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON lines instead.")] = False,
    limit: Annotated[int | None, typer.Option(help="Only the latest N checkpoints.")] = None,
) -> None:
    """Show a pipeline's checkpoints: state, lineage, records, ranges, durations."""
    with reported(LedgerError):
        records = _open(url).list_checkpoints(pipeline, limit=limit)
    if json_out:
        for r in records:
            print(json.dumps(r.summary(), sort_keys=True))
        return
    from airflow_provider_eo.render import checkpoints_table

    _out.print(checkpoints_table(records, title=f"checkpoints of {pipeline}"))


@ledger_app.command("upgrade")
def upgrade_cmd(
    url: UrlOption = DEFAULT_LEDGER_URL,
    conn_id: Annotated[
        str | None,
        typer.Option(
            "--conn-id",
            help="An Airflow connection (eo_ledger or postgres) naming the ledger, looked up "
            "as Airflow does (AIRFLOW_CONN_*, the secrets backend); replaces --ledger-url.",
        ),
    ] = None,
) -> None:
    """Create or migrate the ledger schema to the version this package needs."""
    with reported(LedgerError):
        if conn_id is not None:
            from airflow_provider_eo.hooks.ledger import LedgerHook

            url = LedgerHook(conn_id, create=False).get_url()
        ledger = _open(url)
        before = ledger.current_revision()
        ledger.upgrade()
        after = ledger.current_revision()
    err.print(f"ledger at {redact_url(url)}: schema {before or 'empty'} -> {after}")
