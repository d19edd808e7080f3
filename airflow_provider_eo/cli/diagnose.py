"""``eo doctor``, ``eo audit``, ``eo recover``, ``eo abort``: check a pipeline and repair
what a crash left."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from airflow_provider_eo.cli._common import JsonFlag, PipelineRef, emit, load, opened
from airflow_provider_eo.cli.errors import EXIT_AUDIT_COUNT_ONLY, EXIT_AUDIT_FAILED, err, fail, reported

ForceLive = Annotated[
    bool,
    typer.Option(
        "--force-live",
        help=(
            "Take the commit lease from a committer whose lease still runs. Only when that "
            "committer is known to be dead (its process gone, not paused or slow): a live "
            "committer is fenced and its commit fails. Without it, the command is refused until "
            "the lease runs out (the message names the time)."
        ),
    ),
]


def audit_cmd(ref: PipelineRef, as_json: JsonFlag = False) -> None:
    """Read the sink with read_committed and check every committed checkpoint's records
    against the source. Exit 0: every source record accounted for exactly once (published
    once, dropped by the transform, or one dead letter). Exit 2: duplicates or missing
    records. Exit 4: nothing found wrong, but some output records carry no source position
    (an aggregation's), so their source records were checked by count only."""
    from airflow_provider_eo.core.audit import audit_pipeline

    with reported(), opened(ref) as (pipeline, ledger):
        report = audit_pipeline(pipeline, ledger)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        from airflow_provider_eo.render import print_audit

        print_audit(report)
    if not report.ok:
        raise typer.Exit(EXIT_AUDIT_FAILED)
    raise typer.Exit(0 if report.per_record else EXIT_AUDIT_COUNT_ONLY)


def doctor_cmd(
    ref: PipelineRef,
    as_json: JsonFlag = False,
    spark_probe: Annotated[
        bool,
        typer.Option(
            "--spark-probe/--no-spark-probe",
            help="Run a small Spark job with the pipeline's spark_conf that writes under the "
            "staging location, and check this process sees all of it (run the doctor where "
            "the commit runs).",
        ),
    ] = True,
    acls: Annotated[
        bool,
        typer.Option(
            "--acls",
            help="Check nothing: print the Kafka ACLs the pipeline needs, per role, as "
            "`kafka-acls.sh --add` commands (docs/kafka-acls.md explains each).",
        ),
    ] = False,
    principal: Annotated[
        str,
        typer.Option(
            "--principal",
            help="With --acls: the principal every role runs as (e.g. User:eo).",
        ),
    ] = "User:eo",
    role_principal: Annotated[
        list[str] | None,
        typer.Option(
            "--role-principal",
            help="With --acls: ROLE=PRINCIPAL for a role that runs as another principal "
            "(roles: planner, prepare, committer, audit, watcher, ui, doctor, recover, "
            "operator; a Structured Streaming sink's: query, sink, audit, ui, doctor, recover, "
            "operator); repeatable.",
        ),
    ] = None,
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="With --acls: also print the optional operator role's ACLs (`eo recover "
            "--abort-hanging` ending a hanging transaction: ALTER on the cluster).",
        ),
    ] = False,
    source_topic: Annotated[
        list[str] | None,
        typer.Option(
            "--source-topic",
            help="With --acls on a Structured Streaming sink (KafkaExactlyOnceSink): a topic its "
            "query reads (default: the topics the ledger recorded for its batches); repeatable.",
        ),
    ] = None,
) -> None:
    """Preflight checks (broker, topics, prefix, markers, open transactions, staging and
    whether Spark's executors share it, connector, ledger); each finding says what to
    change. Exits 0 when safe to run (warnings allowed), 1 when any check failed. Changes
    nothing (the staging probes are removed). With --acls, prints the Kafka ACLs the
    pipeline needs instead."""
    if acls:
        _print_acls(ref, principal, role_principal or [], operator=operator, source_topics=source_topic or [])
        return
    from airflow_provider_eo.core.doctor import run_doctor

    probe = None
    if spark_probe:
        from airflow_provider_eo.spark.probe import staging_probe

        probe = staging_probe
    from airflow_provider_eo.streaming.savepoint import load_sink

    sink = load_sink(ref)
    with reported():
        pipeline = load(ref)
        query_location = None
        if sink is not None and sink.checkpoint_location:  # the query's location, read here
            from functools import partial

            from airflow_provider_eo.staging_fs import store_for
            from airflow_provider_eo.streaming.checkpoint_location import read_location

            query_location = partial(read_location, sink.checkpoint_location, store_for(pipeline))
        report = run_doctor(pipeline, staging_probe=probe, query_location=query_location)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        from airflow_provider_eo.render import print_doctor

        print_doctor(report)
    raise typer.Exit(report.exit_code)


def _print_acls(
    ref: str, principal: str, overrides: list[str], *, operator: bool, source_topics: list[str]
) -> None:
    """``eo doctor --acls``: the pipeline's ACLs as kafka-acls.sh commands, one role a block (a
    Structured Streaming sink's roles for a ``KafkaExactlyOnceSink``)."""
    from airflow_provider_eo.kafka.acls import kafka_acls_commands, parse_role_principals, pipeline_acls
    from airflow_provider_eo.streaming.savepoint import load_sink

    with reported():
        sink = load_sink(ref)
        if source_topics and sink is None:
            fail(f"{ref}: --source-topic is for a Structured Streaming sink (a KafkaExactlyOnceSink)")
        pipeline = sink.as_pipeline(source_topics or None) if sink is not None else load(ref)
        entries = pipeline_acls(
            pipeline,
            principal,
            roles=parse_role_principals(overrides),
            operator=operator,
            structured_streaming=sink is not None,
        )
        bootstrap = str(pipeline.kafka.get("bootstrap.servers") or "<bootstrap>")
    for line in kafka_acls_commands(entries, bootstrap=bootstrap):
        print(line)


def recover_cmd(
    ref: PipelineRef,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the sink's stable offsets after fencing.")
    ] = 15.0,
    force_live: ForceLive = False,
    abort_hanging: Annotated[
        bool,
        typer.Option(
            "--abort-hanging",
            help=(
                "First list the open transactions on the sink and the marker group's partition "
                "with Kafka's Java admin client (needs a Java runtime and the kafka-clients jar: "
                "`eo setup jars`) and end ours: by fencing their transactional id, or, for a "
                "hanging one no transaction coordinator holds, by KIP-664's abort. Foreign ones "
                "are named and left alone."
            ),
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Resolve open transactions of this pipeline safely: commit its PREPARED checkpoint by
    the markers, fence every transactional id it used (aborting a zombie's open
    transaction), then check the sink. Exits 0 when no transaction is left open on the
    sink, 1 when one is (not ours: the message says how to find its owner). Refused while a
    committer holds a live commit lease, unless --force-live. With --abort-hanging, ours are
    listed and ended first, hanging ones included."""
    from airflow_provider_eo.core.recover import recover_pipeline
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.runtime import build_runtime

    with reported(), opened(ref) as (pipeline, ledger):
        result = recover_pipeline(
            pipeline,
            ledger,
            actor=Actor.here(),
            wait_s=wait,
            progress=lambda line: err.print(line),
            force_live=force_live,
            abort_hanging=abort_hanging,
            runner=build_runtime(pipeline, stage=False).runner,
        )
    emit(result.summary(), as_json)
    if not result.clean:
        parts = ", ".join(f"[{p}] {s} < {h}" for p, (s, h) in sorted(result.open_after.items()))
        if result.hanging is not None and result.hanging.foreign:
            fail(
                f"pipeline {result.pipeline!r}: transactions still open on {result.sink_topic} "
                f"(stable < high: {parts}); they are not this pipeline's and were left alone: "
                f"{'; '.join(result.hanging.foreign)}. Ask their owner to finish them, or abort "
                "them with `kafka-transactions.sh --bootstrap-server ... abort` if they are known "
                "to be abandoned."
            )
        fail(
            f"pipeline {result.pipeline!r}: transactions still open on {result.sink_topic} after "
            f"fencing every transactional id of ours (stable < high: {parts}); they are not this "
            "pipeline's. Find the owner with `kafka-transactions.sh --bootstrap-server ... "
            f"find-hanging --topic {result.sink_topic}` and abort it there."
        )


def abort_cmd(
    ref: PipelineRef,
    checkpoint: Annotated[int, typer.Argument(help="Id of the unfinished checkpoint to abort.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the ledger).")],
    force_live: ForceLive = False,
    as_json: JsonFlag = False,
) -> None:
    """Abort an unfinished checkpoint so its range is replanned: fences every commit shard
    first, refused while a committer holds a live lease (unless --force-live) or when a shard
    already published it."""
    from airflow_provider_eo.core.abort import abort_checkpoint
    from airflow_provider_eo.ledger import Actor

    if not reason.strip():
        fail("--reason must not be empty: it is recorded with the abort")
    with reported(), opened(ref) as (pipeline, ledger):
        cp = abort_checkpoint(
            pipeline, ledger, checkpoint, reason=reason, actor=Actor.here(), force_live=force_live
        )
    emit(cp.summary(), as_json)
