"""Every rich table and line the ``eo`` commands and the demo print, in one module.

The protocol modules never import it; the CLI and the demo do, lazily.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from airflow_provider_eo.core.audit import AuditReport
    from airflow_provider_eo.core.doctor import DoctorReport
    from airflow_provider_eo.ledger import CheckpointRecord, PipelineRecord, SavepointRecord

# Wide enough for the tables when the output is a file or a CI log, not a terminal.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

OK = "[green]✓[/]"
FAILED = "[red]✗[/]"

# The order of the steps of ``eo_pipeline_group``, for the Airflow demo's run lines.
_STEP_ORDER = ("plan", "prepare", "wait", "commit")


def mark(ok: bool) -> str:
    """A green tick or a red cross."""
    return OK if ok else FAILED


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


def checkpoints_table(records: Sequence[CheckpointRecord], *, title: str | None = None) -> Table:
    """A rich table of checkpoints: id, state, lineage, records, dead letters, ranges, durations
    (and the micro-batch id when they are a Structured Streaming query's batches)."""
    batches = any(r.batch_id is not None for r in records)
    table = Table(title=title, header_style="bold")
    table.add_column("id", justify="right")
    if batches:
        table.add_column("batch", justify="right")
    table.add_column("state")
    table.add_column("lineage", justify="right")
    table.add_column("records", justify="right")
    table.add_column("dead letters", justify="right")
    table.add_column("ranges")
    table.add_column("plan→prepare", justify="right")
    table.add_column("prepare→commit", justify="right")
    for r in records:
        style = _STATE_STYLE.get(r.state.value, "")
        table.add_row(
            str(r.checkpoint_id),
            *(["-" if r.batch_id is None else str(r.batch_id)] if batches else []),
            f"[{style}]{r.state.value}[/]" if style else r.state.value,
            str(r.lineage),
            "-" if r.records is None else str(r.records),
            "-" if r.dead_letters is None else str(r.dead_letters),
            ", ".join(rg.compact() for rg in r.ranges),
            _duration(r.planned_at, r.prepared_at),
            _duration(r.prepared_at, r.committed_at),
        )
    return table


def pipelines_table(pipelines: Sequence[PipelineRecord], *, title: str | None = None) -> Table:
    """A rich table of the ledger's pipelines (``eo pipelines``)."""
    table = Table(title=title, header_style="bold")
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
    return table


def savepoints_table(savepoints: Sequence[SavepointRecord], *, title: str | None = None) -> Table:
    """A rich table of a pipeline's savepoints (``eo savepoint list``)."""
    table = Table(title=title, header_style="bold")
    for col in ("name", "checkpoint", "offsets", "created", "by", "note"):
        table.add_column(col, justify="right" if col == "checkpoint" else "left")
    for sp in savepoints:
        offsets = ", ".join(
            f"{t}[{p}]:{o}" for t, parts in sorted(sp.offsets.items()) for p, o in sorted(parts.items())
        )
        by = sp.created_by + (f" ({sp.dag_id}/{sp.run_id})" if sp.dag_id else "")
        table.add_row(
            sp.name,
            "-" if sp.checkpoint_id is None else str(sp.checkpoint_id),
            offsets,
            sp.created_at.isoformat(timespec="seconds"),
            by,
            sp.note,
        )
    return table


def print_checkpoints(records: Sequence[CheckpointRecord], *, title: str | None = None) -> None:
    """The ledger's checkpoint table (the same table as ``eo checkpoints``)."""
    console.print(checkpoints_table(records, title=title))


def print_audit(report: AuditReport) -> None:
    """The audit as a table plus a one-line verdict."""
    table = Table(title=f"audit of {report.pipeline} -> {report.sink_topic} (read_committed)")
    cols = ("checkpoint", "source", "published", "dropped", "dead letters", "staged", "observed")
    for col in (*cols, "duplicates", "missing"):
        table.add_column(col, justify="right")
    for c in report.checkpoints:
        table.add_row(
            str(c.checkpoint_id),
            str(c.source_records),
            str(c.source_published),
            "?" if c.dropped is None else str(c.dropped),
            str(c.dead_letters),
            str(c.expected),
            str(c.observed),
            str(c.duplicates),
            str(c.missing),
        )
    console.print(table)
    colour = "green" if report.ok and report.per_record else "yellow" if report.ok else "red"
    verdict = f"[{colour}]{report.outcome}[/]"
    console.print(
        f"{verdict}: duplicates={report.duplicates} missing={report.missing} "
        f"unexpected={report.unexpected} foreign={report.foreign}"
    )
    console.print(
        f"source: records={report.source_records} dropped_by_transform={report.dropped} "
        f"dead_letters={report.dead_letters} expired={report.source_expired}"
    )
    if report.unpositioned:
        console.print(
            f"[yellow]{report.unpositioned} output records carry no source position: checked by "
            f"count only[/] ({report.source_unchecked} source records of their checkpoints are named "
            "by no output record: the transform does not keep one output record per source record, "
            "e.g. an aggregation)"
        )
    if report.duplicated_sources:
        console.print(
            f"[red]source records accounted for more than once:[/] {', '.join(report.duplicated_sources)}"
        )
    if report.missing_sources:
        console.print(f"[red]source records missing:[/] {', '.join(report.missing_sources)}")
    if report.source_expired:
        console.print(
            f"[yellow]{report.source_expired} planned source offsets were deleted by retention "
            "before this audit: those records cannot be checked against the source any more[/]"
        )


def print_dag_run(n: int, run: dict[str, Any]) -> None:
    """One line per DAG run of the Airflow demo: state and the try number of every step."""
    steps = sorted(run["tis"].items(), key=lambda kv: _STEP_ORDER.index(kv[0].split(".")[-1]))
    tries = ", ".join(f"{task.split('.')[-1]}#{try_}" for task, (_state, try_) in steps)
    console.print(
        f"{mark(run['state'] == 'success')} run {n} {run['run_id']}: {run['state']}  "
        f"tries: {tries}  ({run['seconds']:.1f}s)"
    )


_SEVERITY_MARK = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def print_doctor(report: DoctorReport) -> None:
    """``eo doctor``: one line per finding (severity, check, what was found), the change to
    make under it, and a verdict."""
    console.print(f"[bold]eo doctor[/] {report.pipeline}")
    for f in report.findings:
        console.print(f"  {_SEVERITY_MARK[f.severity]} [bold]{f.check}[/]: {f.found}", soft_wrap=True)
        if f.change and f.severity != "ok":
            console.print(f"         -> {f.change}", soft_wrap=True)
    counts = f"{report.count('ok')} ok, {report.count('warn')} warn, {report.count('fail')} fail"
    verdict = "[green]safe to run[/]" if report.safe else "[bold red]not safe to run[/]"
    console.print(f"{verdict} ({counts})")
