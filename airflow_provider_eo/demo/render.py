"""What the demo and ``eo audit`` print: the one module that builds their rich output."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from airflow_provider_eo.kafka.audit import AuditReport
    from airflow_provider_eo.ledger import CheckpointRecord

# Wide enough for the tables when the output is a file or a CI log, not a terminal.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

OK = "[green]✓[/]"
FAILED = "[red]✗[/]"

# The order of the steps of ``eo_pipeline_group``, for the Airflow demo's run lines.
_STEP_ORDER = ("plan", "prepare", "wait", "commit")


def mark(ok: bool) -> str:
    """A green tick or a red cross."""
    return OK if ok else FAILED


def print_checkpoints(records: Sequence[CheckpointRecord], *, title: str | None = None) -> None:
    """The ledger's checkpoint table (the same table as ``eo checkpoints``)."""
    from airflow_provider_eo.ledger.cli import render_checkpoints_table

    console.print(render_checkpoints_table(records, title=title))


def print_audit(report: AuditReport) -> None:
    """The audit as a table plus a one-line verdict."""
    from rich.table import Table

    table = Table(title=f"audit of {report.pipeline} -> {report.sink_topic} (read_committed)")
    for col in ("checkpoint", "expected", "observed", "duplicates", "missing"):
        table.add_column(col, justify="right")
    for c in report.checkpoints:
        table.add_row(
            str(c.checkpoint_id), str(c.expected), str(c.observed), str(c.duplicates), str(c.missing)
        )
    console.print(table)
    verdict = "[green]exactly once[/]" if report.ok else "[red]NOT exactly once[/]"
    console.print(
        f"{verdict}: duplicates={report.duplicates} missing={report.missing} "
        f"unexpected={report.unexpected} foreign={report.foreign}"
    )


def print_dag_run(n: int, run: dict[str, Any]) -> None:
    """One line per DAG run of the Airflow demo: state and the try number of every step."""
    steps = sorted(run["tis"].items(), key=lambda kv: _STEP_ORDER.index(kv[0].split(".")[-1]))
    tries = ", ".join(f"{task.split('.')[-1]}#{try_}" for task, (_state, try_) in steps)
    console.print(
        f"{mark(run['state'] == 'success')} run {n} {run['run_id']}: {run['state']}  "
        f"tries: {tries}  ({run['seconds']:.1f}s)"
    )
