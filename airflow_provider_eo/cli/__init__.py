"""``eo``: the provider's operations without Airflow, plus the local development stack.

One module per command family (:mod:`.run`, :mod:`.stream`, :mod:`.savepoints`,
:mod:`.backfill`, :mod:`.diagnose`, :mod:`.ledger`, :mod:`.dev`); :mod:`.errors` turns
errors into messages and exit codes. This module only mounts them: the order below is the
order ``eo --help`` lists them in. Each command imports what it runs (Spark, Kafka, Airflow)
inside its body, so ``eo --help`` starts fast.
"""

from __future__ import annotations

import sys

import typer

from airflow_provider_eo.cli import backfill, dev, diagnose, ledger, run, savepoints, stream
from airflow_provider_eo.cli.errors import EXIT_STOPPED, err

__all__ = ["EXIT_STOPPED", "app", "main"]

app = typer.Typer(
    help="Exactly-once Kafka -> PySpark -> Kafka pipelines: checkpoints, commits, audits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.command("demo")(dev.demo_cmd)
app.command("run-once")(run.run_once_cmd)
app.command("plan")(run.plan_cmd)
app.command("prepare")(run.prepare_cmd)
app.command("commit")(run.commit_cmd)
app.command("abort")(diagnose.abort_cmd)
app.command("backfill")(backfill.backfill_cmd)
app.command("audit")(diagnose.audit_cmd)
app.command("stream")(stream.stream_cmd)
app.command("stream-stop")(stream.stream_stop_cmd)
app.command("doctor")(diagnose.doctor_cmd)
app.command("recover")(diagnose.recover_cmd)
app.command("restore")(savepoints.restore_cmd)
app.command("reset")(savepoints.reset_cmd)
app.command("stop")(savepoints.stop_cmd)
app.command("resume")(savepoints.resume_cmd)
# The ledger's read commands at top level, its schema command as `eo ledger upgrade`.
app.command("pipelines")(ledger.pipelines_cmd)
app.command("checkpoints")(ledger.checkpoints_cmd)

app.add_typer(dev.dev_app, name="dev")
app.add_typer(dev.setup_app, name="setup", no_args_is_help=True)
app.add_typer(savepoints.savepoint_app, name="savepoint", no_args_is_help=True)
app.add_typer(ledger.ledger_app, name="ledger")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
