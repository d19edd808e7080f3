"""``eo``: the provider's operations without Airflow, plus the local development stack."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from airflow_provider_eo.errors import EoError, PipelineStopped
from airflow_provider_eo.ledger import cli as ledger_cli
from airflow_provider_eo.stack.errors import StackError

app = typer.Typer(
    help="Exactly-once Kafka -> PySpark -> Kafka pipelines: checkpoints, commits, audits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(help="The local stack: a real Kafka broker (KRaft) on 127.0.0.1.")
app.add_typer(dev_app, name="dev")

err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)


#: Exit code of ``eo plan`` / ``eo run-once`` for a stopped pipeline (not a failure: nothing
#: new is planned until ``eo resume``); 1 is an error, 2 a failed audit.
EXIT_STOPPED = 3


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _say_ledger(url: str) -> None:
    """Print which ledger this command uses (``ledger: <resolved, redacted url>``), on
    stderr so ``--json`` output stays parseable."""
    from airflow_provider_eo.ledger.urls import describe_ledger_url

    err.print(f"ledger: {describe_ledger_url(url)}", highlight=False, soft_wrap=True)


@dev_app.command("up")
def dev_up(
    port: Annotated[int | None, typer.Option(help="Client port (default: a free one, kept).")] = None,
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


setup_app = typer.Typer(help="One-time set-up where the jars are built (image build, deploy step).")
app.add_typer(setup_app, name="setup", no_args_is_help=True)


@setup_app.command("jars")
def setup_jars() -> None:
    """Fetch the Spark Kafka connector matching the installed pyspark (Maven) and build eo's
    JVM partitioner jar (javac) into the eo home (EO_HOME); print them comma-separated.

    Run it once where Maven and a JDK exist (the Airflow image build, a deploy step): the
    Airflow tasks then add these jars themselves and never run a build tool. Without them a
    task needs the connector in its packages/jars, and sink partitions use the Arrow UDF."""
    from airflow_provider_eo.spark.session import connector_jars_csv
    from airflow_provider_eo.stack.paths import state_dir

    try:
        jars = connector_jars_csv()
    except StackError as exc:
        _fail(str(exc))
        return
    err.print(f"installed under {state_dir() / 'jars'}", highlight=False)
    print(jars)


@app.command("demo")
def demo(
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
    try:
        if airflow:
            from airflow_provider_eo.demo.airflow import run_airflow_demo

            code = run_airflow_demo()
        else:
            from airflow_provider_eo.demo.direct import run_demo

            code = run_demo(keep_broker=keep)
    except _user_errors() as exc:
        _fail(str(exc))
        return
    raise typer.Exit(code)


PipelineRef = Annotated[str, typer.Argument(help="MODULE:ATTR of a Pipeline, e.g. mypkg.pipes:ORDERS")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print a JSON summary.")]


def _user_errors() -> tuple[type[BaseException], ...]:
    """Every error a user can hit derives from the one root (``errors.py``)."""
    return (EoError,)


def _emit(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
    else:
        out.print(" ".join(f"[bold]{k}[/]={v}" for k, v in summary.items()), highlight=False)


@app.command("run-once")
def run_once_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """One full cycle: resume anything unfinished, else plan the next checkpoint; prepare; commit.

    Exits 3 when the pipeline is stopped and nothing is unfinished (`eo resume`)."""
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        result = run_once(pipeline)
    except PipelineStopped as exc:
        _fail(str(exc), EXIT_STOPPED)
        return
    except _user_errors() as exc:
        _fail(str(exc))
        return
    _emit(result.as_dict(), as_json)


@app.command("plan")
def plan_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Plan the next checkpoint (or return the unfinished one); exits 3 when the pipeline is
    stopped and nothing is unfinished (`eo resume`)."""
    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.ledger import Actor, Ledger
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        with Ledger(pipeline.ledger_url) as ledger:
            cp = plan_checkpoint(pipeline, ledger, actor=Actor.here())
    except PipelineStopped as exc:
        _fail(str(exc), EXIT_STOPPED)
        return
    except _user_errors() as exc:
        _fail(str(exc))
        return
    _emit(cp.summary() if cp else {"pipeline": pipeline.name, "checkpoint_id": None}, as_json)


CheckpointOpt = Annotated[int | None, typer.Option(help="Checkpoint id (default: the unfinished one).")]


def _run_phase(ref: str, checkpoint: int | None, phase: Callable[[Any, Any, int], Any]) -> Any:
    """Load the pipeline, open its ledger, pick the checkpoint and run one phase on it;
    a user-facing error is printed and exits 1."""
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        with Ledger(pipeline.ledger_url) as ledger:
            cid = checkpoint if checkpoint is not None else _unfinished_id(ledger, pipeline.name)
            return phase(pipeline, ledger, cid)
    except _user_errors() as exc:
        _fail(str(exc))


@app.command("prepare")
def prepare_cmd(ref: PipelineRef, checkpoint: CheckpointOpt = None, as_json: JsonFlag = False) -> None:
    """Prepare a PLANNED checkpoint with Spark (local[*] unless the pipeline names a master)."""
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.spark.prepare import prepare_checkpoint
    from airflow_provider_eo.spark.session import get_spark

    def phase(pipeline: Any, ledger: Any, cid: int) -> Any:
        spark = get_spark(f"eo-prepare-{pipeline.name}", pipeline.spark_conf)
        return prepare_checkpoint(spark, pipeline, ledger, cid, actor=Actor.here())

    result = _run_phase(ref, checkpoint, phase)
    _emit({**result.checkpoint.summary(), "attempt": result.attempt, "note": result.note}, as_json)


@app.command("commit")
def commit_cmd(ref: PipelineRef, checkpoint: CheckpointOpt = None, as_json: JsonFlag = False) -> None:
    """Publish a PREPARED checkpoint in Kafka transactions and mark it COMMITTED."""
    from airflow_provider_eo.core.commit import commit_checkpoint
    from airflow_provider_eo.ledger import Actor

    result = _run_phase(
        ref,
        checkpoint,
        lambda pipeline, ledger, cid: commit_checkpoint(pipeline, ledger, cid, actor=Actor.here()),
    )
    _emit(
        {
            **result.checkpoint.summary(),
            "published": result.published,
            "seconds": round(result.seconds, 3),
            "note": result.note,
        },
        as_json,
    )


@app.command("abort")
def abort_cmd(
    ref: PipelineRef,
    checkpoint: Annotated[int, typer.Argument(help="Id of the unfinished checkpoint to abort.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the ledger).")],
    as_json: JsonFlag = False,
) -> None:
    """Abort an unfinished checkpoint so its range is replanned: fences every commit shard
    first, refused while a committer is live or when a shard already published it."""
    from airflow_provider_eo.core.abort import abort_checkpoint
    from airflow_provider_eo.ledger import Actor

    if not reason.strip():
        _fail("--reason must not be empty: it is recorded with the abort")
    cp = _run_phase(
        ref,
        checkpoint,
        lambda pipeline, ledger, cid: abort_checkpoint(
            pipeline, ledger, cid, reason=reason, actor=Actor.here()
        ),
    )
    _emit(cp.summary(), as_json)


@app.command("backfill")
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
    from airflow_provider_eo.core.backfill import iso_ms, parse_instant, run_backfill
    from airflow_provider_eo.ledger import Actor, CheckpointRecord, Ledger
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        start_ms, end_ms = parse_instant(start), parse_instant(end)
    except ValueError as exc:
        _fail(f"{exc}; pass --start and --end as ISO-8601, e.g. 2024-05-01T00:00:00Z")
        return

    def progress(cp: CheckpointRecord) -> None:
        window = " - ".join(iso_ms(x) for x in cp.time_filter) if cp.time_filter else "?"
        ranges = " ".join(r.compact() for r in cp.ranges)
        err.print(
            f"checkpoint {cp.checkpoint_id} committed: {cp.records} records [{window}) {ranges}",
            highlight=False,
            soft_wrap=True,
        )

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        with Ledger(pipeline.ledger_url) as ledger:
            result = run_backfill(
                pipeline,
                ledger,
                start_ms,
                end_ms,
                sink_topic=sink_topic,
                transform=transform,
                allow_live_sink=allow_live_sink,
                actor=Actor.here(),
                progress=progress,
            )
    except _user_errors() as exc:
        _fail(str(exc))
        return
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        summary.pop("details")
        _emit(summary, False)


def _unfinished_id(ledger: Any, pipeline: str) -> int:
    cp = ledger.unfinished(pipeline)
    if cp is None:
        raise EoError(f"pipeline {pipeline!r} has no unfinished checkpoint; run `eo plan` first")
    return int(cp.checkpoint_id)


@app.command("audit")
def audit_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Read the sink with read_committed and check every committed checkpoint's records."""
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        with Ledger(pipeline.ledger_url) as ledger:
            report = audit_pipeline(pipeline, ledger)
    except _user_errors() as exc:
        _fail(str(exc))
        return
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        from airflow_provider_eo.render import print_audit

        print_audit(report)
    raise typer.Exit(0 if report.ok else 2)


# -- streaming mode (issue 15) ---------------------------------------------------------------


@app.command("stream")
def stream_cmd(
    ref: PipelineRef,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between checkpoints (plan, prepare, hand on).")
    ] = 5.0,
    commit: Annotated[
        str,
        typer.Option(
            "--commit",
            help="inline: this process commits each prepared checkpoint; airflow: it only "
            "prepares (the Airflow commit operator commits), still bounded by max_pending.",
        ),
    ] = "inline",
    duration: Annotated[
        float | None, typer.Option("--duration", help="Stop cleanly after this many seconds.")
    ] = None,
    checkpoints: Annotated[
        int | None, typer.Option("--checkpoints", help="Stop cleanly after this many checkpoints.")
    ] = None,
    heartbeat: Annotated[
        float,
        typer.Option(
            "--heartbeat",
            help="Seconds between the run's heartbeats in the ledger (a run silent for 4 "
            "heartbeats counts as lost).",
        ),
    ] = 5.0,
    as_json: JsonFlag = False,
) -> None:
    """Streaming mode: one Spark session plans, prepares and commits a checkpoint every
    --interval seconds (prepare of the next overlaps the commit of the last) until SIGTERM,
    --duration or --checkpoints; prints one line per checkpoint and a summary on exit.

    SIGTERM/SIGINT finish the in-flight checkpoints and exit 0; a restart resumes whatever a
    killed run left. A stopped pipeline (`eo stop`) ends the stream cleanly too."""
    from airflow_provider_eo.core.stream import COMMIT_MODES, StreamCheckpoint, run_stream
    from airflow_provider_eo.pipeline import load_pipeline

    if commit not in COMMIT_MODES:
        _fail(f"--commit must be one of {', '.join(COMMIT_MODES)}, got {commit!r}")
    if duration is not None and checkpoints is not None:
        _fail("give --duration or --checkpoints, not both")
    if interval <= 0:
        _fail(f"--interval must be > 0 seconds, got {interval}")
    if heartbeat <= 0:
        _fail(f"--heartbeat must be > 0 seconds, got {heartbeat}")

    def line(cp: StreamCheckpoint) -> None:
        if as_json:
            print(json.dumps(cp.summary()), flush=True)
        else:
            summary = cp.summary()
            print(" ".join(f"{k}={'-' if v is None else v}" for k, v in summary.items()), flush=True)

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        result = run_stream(
            pipeline,
            interval_s=interval,
            commit=commit,  # type: ignore[arg-type]  # checked against COMMIT_MODES above
            duration_s=duration,
            max_checkpoints=checkpoints,
            on_checkpoint=line,
            heartbeat_s=heartbeat,
        )
    except _user_errors() as exc:
        _fail(str(exc))
        return
    summary = result.summary()
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        print("stream: " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)


@app.command("stream-stop")
def stream_stop_cmd(
    ref: PipelineRef,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Only this run (default: every running one).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ask the pipeline's running streaming application to stop cleanly (as SIGTERM does:
    in-flight checkpoints finish), from any host that reaches the ledger. It stops at its
    next heartbeat; `eo stream` / the Airflow task then ends with reason `stop requested`."""
    from airflow_provider_eo.ledger import Actor

    def ask(pipeline: Any, ledger: Any) -> list[str]:
        return list(
            ledger.request_stream_stop(pipeline.name, requested_by=Actor.here().label(), run_id=run_id)
        )

    asked = _with_ledger(ref, ask)
    if not asked:
        _fail(f"no running streaming application{f' with run id {run_id}' if run_id else ''} in the ledger")
    _emit({"stop_requested": asked}, as_json)


@app.command("doctor")
def doctor_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Preflight checks (broker, topics, prefix, markers, open transactions, staging,
    connector, ledger); each finding says what to change. Exits 0 when safe to run
    (warnings allowed), 1 when any check failed. Changes nothing."""
    from airflow_provider_eo.core.doctor import run_doctor
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        report = run_doctor(pipeline)
    except _user_errors() as exc:
        _fail(str(exc))
        return
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        from airflow_provider_eo.render import print_doctor

        print_doctor(report)
    raise typer.Exit(report.exit_code)


@app.command("recover")
def recover_cmd(
    ref: PipelineRef,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the sink's stable offsets after fencing.")
    ] = 15.0,
    as_json: JsonFlag = False,
) -> None:
    """Resolve open transactions of this pipeline safely: commit its PREPARED checkpoint by
    the markers, fence every transactional id it used (aborting a zombie's open
    transaction), then check the sink. Exits 0 when no transaction is left open on the
    sink, 1 when one is (not ours: the message says how to find its owner)."""
    from airflow_provider_eo.core.recover import recover_pipeline
    from airflow_provider_eo.ledger import Actor

    result = _with_ledger(
        ref,
        lambda pipeline, ledger: recover_pipeline(
            pipeline, ledger, actor=Actor.here(), wait_s=wait, progress=lambda line: err.print(line)
        ),
    )
    _emit(result.summary(), as_json)
    if not result.clean:
        parts = ", ".join(f"[{p}] {s} < {h}" for p, (s, h) in sorted(result.open_after.items()))
        _fail(
            f"pipeline {result.pipeline!r}: transactions still open on {result.sink_topic} after "
            f"fencing every transactional id of ours (stable < high: {parts}); they are not this "
            "pipeline's. Find the owner with `kafka-transactions.sh --bootstrap-server ... "
            f"find-hanging --topic {result.sink_topic}` and abort it there."
        )


# -- savepoints, stop/resume, restore, reset ----------------------------------------------------

savepoint_app = typer.Typer(help="Named, retained positions of a pipeline (restore starts from them).")
app.add_typer(savepoint_app, name="savepoint", no_args_is_help=True)


def _with_ledger(ref: str, action: Callable[[Any, Any], Any]) -> Any:
    """Load the pipeline, open its ledger, run ``action(pipeline, ledger)``; a user-facing
    error is printed (it names the pipeline and what to do) and exits 1."""
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import load_pipeline

    try:
        pipeline = load_pipeline(ref)
        _say_ledger(pipeline.ledger_url)
        with Ledger(pipeline.ledger_url) as ledger:
            return action(pipeline, ledger)
    except _user_errors() as exc:
        _fail(str(exc))


class _WaitProgress:
    """Prints, on stderr, what a savepoint waits for: when it changes and every 10 s."""

    def __init__(self) -> None:
        self.last: tuple[int, str] | None = None
        self.printed_at = -1e9

    def __call__(self, cp: Any, waited: float, wait_s: float) -> None:
        key = (cp.checkpoint_id, cp.state.value)
        if key != self.last or waited - self.printed_at >= 10:
            err.print(
                f"waiting for checkpoint {cp.checkpoint_id} ({cp.state.value}) to finish: "
                f"{waited:.0f}s of {wait_s:.0f}s",
                highlight=False,
            )
            self.last, self.printed_at = key, waited


@savepoint_app.command("create")
def savepoint_create_cmd(
    ref: PipelineRef,
    name: Annotated[str, typer.Argument(help="Savepoint name, unique per pipeline.")],
    note: Annotated[str, typer.Option("--note", help="Free text kept with the savepoint.")] = "",
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the pipeline first (stop-with-savepoint).")
    ] = False,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the checkpoint in flight to finish.")
    ] = 600.0,
    as_json: JsonFlag = False,
) -> None:
    """Record a savepoint at the newest COMMITTED checkpoint (waiting for the one in flight)."""
    from airflow_provider_eo.core.savepoint import take_savepoint
    from airflow_provider_eo.ledger import Actor

    sp = _with_ledger(
        ref,
        lambda pipeline, ledger: take_savepoint(
            pipeline,
            ledger,
            name,
            note=note,
            stop=stop,
            wait_s=wait,
            actor=Actor.here(),
            progress=_WaitProgress(),
        ),
    )
    _emit(sp.summary(), as_json)
    if stop and not as_json:
        err.print("the pipeline is stopped; `eo resume MODULE:ATTR` lets it plan again")


@savepoint_app.command("list")
def savepoint_list_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """The pipeline's savepoints, oldest first."""
    sps = _with_ledger(ref, lambda pipeline, ledger: ledger.list_savepoints(pipeline.name))
    if as_json:
        print(json.dumps([sp.summary() for sp in sps]))
        return
    from airflow_provider_eo.render import console, savepoints_table

    console.print(savepoints_table(sps))


@savepoint_app.command("delete")
def savepoint_delete_cmd(
    ref: PipelineRef, name: Annotated[str, typer.Argument(help="The savepoint to delete.")]
) -> None:
    """Delete a savepoint (the event log keeps what it held)."""
    from airflow_provider_eo.ledger import Actor

    sp = _with_ledger(
        ref, lambda pipeline, ledger: ledger.delete_savepoint(pipeline.name, name, actor=Actor.here())
    )
    err.print(f"deleted savepoint {sp.name!r} of pipeline {sp.pipeline!r}", highlight=False)


@app.command("restore")
def restore_cmd(
    ref: PipelineRef,
    savepoint: Annotated[str, typer.Option("--savepoint", help="Name of the savepoint to start from.")],
    allow_non_restored: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored",
            help="Drop partitions that no longer exist; start partitions the savepoint lacks from earliest.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a new lineage at a savepoint's offsets (what follows is processed again)."""
    from airflow_provider_eo.core.restore import restore_from_savepoint
    from airflow_provider_eo.ledger import Actor

    result = _with_ledger(
        ref,
        lambda pipeline, ledger: restore_from_savepoint(
            pipeline, ledger, savepoint, allow_non_restored=allow_non_restored, actor=Actor.here()
        ),
    )
    _emit(result.summary(), as_json)


@app.command("reset")
def reset_cmd(
    ref: PipelineRef,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="earliest | latest | timestamp=<ISO-8601> | offsets=<JSON {topic: {partition: offset}}>",
        ),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Start a new lineage at earliest, latest, a timestamp or given offsets."""
    from airflow_provider_eo.core.restore import reset_pipeline
    from airflow_provider_eo.ledger import Actor

    result = _with_ledger(
        ref, lambda pipeline, ledger: reset_pipeline(pipeline, ledger, to, actor=Actor.here())
    )
    _emit(result.summary(), as_json)


def _stop_line(p: Any) -> dict[str, Any]:
    return {
        "pipeline": p.name,
        "stopped": p.stopped,
        "stopped_by": p.stopped_by,
        "stopped_at": p.stopped_at.isoformat() if p.stopped_at else None,
        "reason": p.stop_reason,
    }


@app.command("stop")
def stop_cmd(
    ref: PipelineRef,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the ledger).")] = "eo stop",
    as_json: JsonFlag = False,
) -> None:
    """Stop planning new checkpoints (the unfinished one still finishes)."""
    from airflow_provider_eo.core.savepoint import stop_pipeline
    from airflow_provider_eo.ledger import Actor

    p = _with_ledger(
        ref, lambda pipeline, ledger: stop_pipeline(pipeline, ledger, reason=reason, actor=Actor.here())
    )
    _emit(_stop_line(p), as_json)


@app.command("resume")
def resume_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Clear a stop: plan starts new checkpoints again."""
    from airflow_provider_eo.core.savepoint import resume_pipeline
    from airflow_provider_eo.ledger import Actor

    p = _with_ledger(ref, lambda pipeline, ledger: resume_pipeline(pipeline, ledger, actor=Actor.here()))
    _emit(_stop_line(p), as_json)


# The ledger's read commands at top level, its schema command as `eo ledger upgrade`.
app.command("pipelines")(ledger_cli.pipelines_cmd)
app.command("checkpoints")(ledger_cli.checkpoints_cmd)
_ledger_app = typer.Typer(help="The checkpoint ledger's schema.", no_args_is_help=True)
_ledger_app.command("upgrade")(ledger_cli.upgrade_cmd)
app.add_typer(_ledger_app, name="ledger")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
