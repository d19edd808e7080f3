"""``eo``: the provider's operations without Airflow, plus the local development stack."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from airflow_provider_eo.stack.errors import StackError

app = typer.Typer(
    help="Exactly-once Kafka -> PySpark -> Kafka pipelines: checkpoints, commits, audits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(help="The local stack: a real Kafka broker (KRaft) on 127.0.0.1.")
app.add_typer(dev_app, name="dev")

err = Console(stderr=True)


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@dev_app.command("up")
def dev_up(
    port: Annotated[
        int | None, typer.Option(help="Client port (default: a free one, kept).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker.")] = 90.0,
) -> None:
    """Start the local Kafka broker (idempotent) and print EO_KAFKA_BOOTSTRAP=..."""
    from airflow_provider_eo.stack.kafka import LocalKafka

    try:
        info = LocalKafka(port=port).up(timeout_s=timeout)
    except StackError as exc:
        _fail(str(exc))
        return
    print(f"EO_KAFKA_BOOTSTRAP={info.bootstrap}", flush=True)


@dev_app.command("down")
def dev_down() -> None:
    """Stop the broker that `eo dev up` started (nothing else)."""
    from airflow_provider_eo.stack.kafka import LocalKafka

    stopped = LocalKafka().down()
    err.print("broker stopped" if stopped else "no broker of ours was running")


@dev_app.command("status")
def dev_status() -> None:
    """Print the running broker's bootstrap address, or exit 1 when none runs."""
    from airflow_provider_eo.stack.kafka import LocalKafka

    info = LocalKafka().info()
    if info is None:
        _fail("no local broker is running; start one with `eo dev up`.")
        return
    print(f"EO_KAFKA_BOOTSTRAP={info.bootstrap}")
    err.print(f"Apache Kafka {info.version}, pid {info.pid}")


@dev_app.command("jars")
def dev_jars() -> None:
    """Print the Spark Kafka connector jars (comma-separated, for --jars / spark.jars)."""
    from airflow_provider_eo.spark.session import connector_jars_csv

    try:
        print(connector_jars_csv())
    except StackError as exc:
        _fail(str(exc))


@app.command("demo")
def demo(
    keep: Annotated[bool, typer.Option(help="Leave the broker running afterwards.")] = False,
) -> None:
    """Run the main job on the embedded defaults and show the round trip."""
    from airflow_provider_eo.demo import run_demo

    try:
        code = run_demo(keep_broker=keep)
    except StackError as exc:
        _fail(str(exc))
        return
    raise typer.Exit(code)


def _mount_optional() -> None:
    """Mount command groups whose modules exist (they land one issue at a time)."""
    try:
        from airflow_provider_eo.ledger import cli as ledger_cli
    except ImportError:
        return
    ledger_cli.mount(app)


_mount_optional()


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
