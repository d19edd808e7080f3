"""``eo dev up|down|status|jars``, ``eo setup jars``, ``eo demo``: the local stack and the demo."""

from __future__ import annotations

from typing import Annotated

import typer

from airflow_provider_eo.cli.errors import err, fail, reported
from airflow_provider_eo.stack.errors import StackError

dev_app = typer.Typer(help="The local stack: a real Kafka broker (KRaft) on 127.0.0.1.")
setup_app = typer.Typer(help="One-time set-up where the jars are built (image build, deploy step).")


@dev_app.command("up")
def dev_up(
    port: Annotated[int | None, typer.Option(help="Client port (default: a free one, kept).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker.")] = 90.0,
) -> None:
    """Start the local Kafka broker (idempotent) and print EO_KAFKA_BOOTSTRAP=..."""
    from airflow_provider_eo.stack.kafka import LocalKafka

    with reported(StackError):
        info = LocalKafka(port=port).up(timeout_s=timeout)
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
        fail("no local broker is running; start one with `eo dev up`.")
    print(f"EO_KAFKA_BOOTSTRAP={info.bootstrap}")
    err.print(f"Apache Kafka {info.version}, pid {info.pid}")


@dev_app.command("jars")
def dev_jars() -> None:
    """Print the Spark Kafka connector jars (comma-separated, for --jars / spark.jars)."""
    from airflow_provider_eo.spark.session import connector_jars_csv

    with reported(StackError):
        print(connector_jars_csv())


@setup_app.command("jars")
def setup_jars(
    s3: Annotated[
        bool,
        typer.Option(
            "--s3/--no-s3",
            help="Also fetch Hadoop's S3A connector (hadoop-aws and its AWS SDK bundle) for staging "
            "under s3a://, when Spark's image does not have it.",
        ),
    ] = False,
) -> None:
    """Fetch the Spark Kafka connector matching the installed pyspark (Maven) and build eo's
    JVM partitioner jar and its Kafka transaction admin tool (javac; `eo doctor` and
    `eo recover --abort-hanging` run it) into the eo home (EO_HOME); print the Spark jars
    comma-separated.

    Run it once where Maven and a JDK exist (the Airflow image build, a deploy step): the
    Airflow tasks then add these jars themselves and never run a build tool. Without them a
    task needs the connector in its packages/jars, and sink partitions use the Arrow UDF."""
    from airflow_provider_eo.spark.session import connector_jars_csv
    from airflow_provider_eo.stack.kafka_admin import admin_classpath
    from airflow_provider_eo.stack.paths import state_dir

    with reported(StackError):
        jars = connector_jars_csv("s3a://" if s3 else None)
        admin_classpath()  # after the connector: its kafka-clients jar is what it compiles against
    err.print(f"installed under {state_dir() / 'jars'}", highlight=False)
    print(jars)


def demo_cmd(
    airflow: Annotated[
        bool,
        typer.Option(
            "--airflow/--no-airflow",
            help="Run through Airflow 3 (the example DAG, dag.test(), one injected Spark "
            "failure recovered by the retry), or call plan/prepare/commit directly.",
        ),
    ] = True,
    keep: Annotated[bool, typer.Option(help="Leave the broker running afterwards.")] = False,
) -> None:
    """Run the main job on the embedded defaults: three exactly-once checkpoints and the audit."""
    with reported():
        if airflow:
            from airflow_provider_eo.demo.airflow import run_airflow_demo

            code = run_airflow_demo()
        else:
            from airflow_provider_eo.demo.direct import run_demo

            code = run_demo(keep_broker=keep)
    raise typer.Exit(code)
