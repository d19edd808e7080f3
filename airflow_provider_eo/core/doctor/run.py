"""The doctor run: gathers the facts from the real services and calls every judge."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Callable
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.core.doctor.broker import judge_transaction_timeout
from airflow_provider_eo.core.doctor.connector import judge_connector
from airflow_provider_eo.core.doctor.facts import (
    _broker_max_timeouts,
    _cached_connector_jars,
    _guard,
    _identity_error,
    _live_partitions,
    _marker_members,
    _same_name_refusal,
    _staging_probe,
)
from airflow_provider_eo.core.doctor.identity import judge_marker_group, judge_prefix, judge_same_name
from airflow_provider_eo.core.doctor.ledger import judge_ledger
from airflow_provider_eo.core.doctor.query import QueryLocationFacts, judge_query
from airflow_provider_eo.core.doctor.report import DoctorReport, Finding
from airflow_provider_eo.core.doctor.staging import judge_staging, judge_staging_shared
from airflow_provider_eo.core.doctor.topics import judge_sink_topic, judge_source_topics
from airflow_provider_eo.core.doctor.transactions import judge_open_transactions, judge_transactions
from airflow_provider_eo.kafka.transactions import JavaAdmin
from airflow_provider_eo.ledger import CheckpointRecord, CommitPlan, PipelineRecord
from airflow_provider_eo.pipeline import Pipeline


def _query_findings(
    ledger: Any, pipeline: str, newest: CheckpointRecord, read: Callable[[], QueryLocationFacts] | None
) -> list[Finding]:
    """:func:`judge_query` on the query's run in the ledger and its checkpoint location."""
    run = ledger.pipeline_overview(pipeline).get("stream")
    facts, bad = (None, None) if read is None else _guard("query", read)
    error = None if bad is None else f"cannot read the query's checkpoint location: {bad.found}"
    return judge_query(pipeline, newest, run, facts, error)


def run_doctor(
    pipeline: Pipeline,
    *,
    now: dt.datetime | None = None,
    spark: bool = True,
    staging_probe: Callable[[Pipeline, str], tuple[int, int]] | None = None,
    query_location: Callable[[], QueryLocationFacts] | None = None,
    transaction_admin: JavaAdmin | None = None,
    list_transactions: bool | None = None,
) -> DoctorReport:
    """Every preflight check of ``pipeline``; changes nothing (see the module docstring).

    :param spark: also check the staging dir and the Spark connector; the plan task's
        preflight passes ``False`` (it runs where plans are made, not where Spark runs).
    :param staging_probe: a Spark write under the staging location and this process's
        count of it: (rows written, rows seen) (the CLI passes
        :func:`airflow_provider_eo.spark.probe.staging_probe`; core never imports Spark).
        ``None``: not checked.
    :param query_location: reads the checkpoint location of the Structured Streaming query
        whose batches the checkpoints are (the CLI passes the sink's); ``None``: unknown.
    :param transaction_admin: the Java admin tool that lists open transactions (default:
        this installation's; when it cannot run, the ``transactions`` finding says why).
    :param list_transactions: list the open transactions (a short JVM run); ``None``: with
        the full doctor (``spark``), not in the plan task's preflight.
    """
    import confluent_kafka

    from airflow_provider_eo.core.hanging import RECENT_CHECKPOINTS, read_pipeline_transactions
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.client_config import librdkafka_config
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.ledger.errors import CheckpointNotFound
    from airflow_provider_eo.stack.maven import installed_spark_version

    findings: list[Finding] = []
    now = now or dt.datetime.now(dt.UTC)

    # 1. The ledger: reachable, migrated; what it knows of this pipeline.
    record: PipelineRecord | None = None
    others: list[tuple[str, str | None]] = []
    unfinished: CheckpointRecord | None = None
    committed: CheckpointRecord | None = None
    expected: dict[tuple[str, int], int] = {}
    known_ids: list[str] = []
    recent: list[CheckpointRecord] = []
    ledger = Ledger(pipeline.ledger_url, create=False)
    try:
        current, bad = _guard("ledger", ledger.current_revision)
        if bad is not None:
            findings.append(
                Finding(
                    "ledger",
                    "fail",
                    f"{ledger.url}: {bad.found}",
                    "check ledger_url and that the database is up",
                )
            )
        else:
            findings.append(
                judge_ledger(current, ledger.head_revision(), dialect=ledger.dialect, url=ledger.url)
            )
            if current is not None:
                others = [(p.name, p.transactional_id_prefix) for p in ledger.list_pipelines()]
                try:
                    record = ledger.get_pipeline(pipeline.name)
                except CheckpointNotFound:
                    record = None
                if record is not None:
                    unfinished = ledger.unfinished(pipeline.name)
                    committed = ledger.last_committed(pipeline.name)
                    expected = dict(ledger.next_starts(pipeline.name))
                    known_ids = ledger.transactional_ids(pipeline.name)
                    recent = ledger.list_checkpoints(pipeline.name, limit=RECENT_CHECKPOINTS)
                    newest = unfinished or committed
                    if newest is not None and newest.query_id is not None:
                        findings.extend(_query_findings(ledger, pipeline.name, newest, query_location))
    finally:
        ledger.close()
    findings.append(
        judge_prefix(
            pipeline.name,
            pipeline.transactional_id_prefix,
            record.transactional_id_prefix if record is not None else None,
            others,
        )
    )

    # 2. Kafka: broker settings, topics, marker group, open transactions.
    config = librdkafka_config(pipeline.kafka)
    maxes, bad = _guard("kafka", _broker_max_timeouts, config)
    if bad is not None:
        findings.append(
            Finding(
                "kafka",
                "fail",
                f"cannot reach Kafka at {config.get('bootstrap.servers')!r}: {bad.found}",
                "check bootstrap.servers and that the cluster is up; the Kafka checks were skipped",
            )
        )
    else:
        findings.append(
            judge_transaction_timeout(pipeline.transaction_timeout_ms, maxes, pipeline=pipeline.name)
        )
        plan: CommitPlan | None = unfinished.commit_plan if unfinished is not None else None
        sinks = [pipeline.sink_topic] + (
            [plan.sink_topic] if plan and plan.sink_topic != pipeline.sink_topic else []
        )
        live = _live_partitions(config, [*pipeline.source_topics, *sinks])
        findings.extend(judge_source_topics(pipeline.source_topics, live, expected, pipeline=pipeline.name))
        for sink in sinks:
            parts = live.get(sink)
            findings.extend(
                judge_sink_topic(
                    sink,
                    None if parts is None else len(parts),
                    pipeline=pipeline.name,
                    unfinished=unfinished,
                    last_committed=committed,
                )
            )
        group = plan.marker_group if plan is not None else names.marker_group(pipeline)
        members, bad = _guard("marker-group members", _marker_members, config, group)
        sink_live = live.get(pipeline.sink_topic)
        identity_error = _identity_error(pipeline, record) if sink_live is not None else None
        if bad is not None:
            findings.append(bad)
            findings.extend(
                f for f in judge_marker_group(group, [], identity_error) if f.check != "marker-group members"
            )
        else:
            findings.extend(judge_marker_group(group, members, identity_error))
        refusal, bad = _guard("same-name deployments", _same_name_refusal, pipeline, record)
        findings.append(bad if bad is not None else judge_same_name(pipeline.name, refusal))
        txn_sink = plan.sink_topic if plan is not None else pipeline.sink_topic
        txn_parts = live.get(txn_sink)
        if txn_parts is not None:
            offsets, bad = _guard("open-transactions", admin.sink_offsets, config, txn_sink, len(txn_parts))
            if bad is not None:
                findings.append(bad)
            else:
                stable, high = offsets
                findings.append(
                    judge_open_transactions(
                        txn_sink,
                        stable,
                        high,
                        unfinished=unfinished,
                        transaction_timeout_ms=pipeline.transaction_timeout_ms,
                        now=now,
                        client_version=str(getattr(confluent_kafka, "__version__", "?")),
                    )
                )
        if spark if list_transactions is None else list_transactions:
            listed, bad = _guard(
                "transactions",
                lambda: read_pipeline_transactions(
                    pipeline, plan=plan, known_ids=known_ids, checkpoints=recent, admin=transaction_admin
                ),
            )
            findings.extend(
                judge_transactions(
                    listed,
                    bad.found if bad is not None else None,
                    pipeline=pipeline.name,
                    unfinished=unfinished,
                    now=now,
                )
            )

    # 3. Staging and Spark.
    if not spark:
        return DoctorReport(pipeline.name, tuple(findings))
    findings.append(judge_staging(pipeline.staging_dir, _staging_probe(pipeline)))
    if staging_probe is not None:
        from airflow_provider_eo import staging

        # Where the prepares stage: pinned in the ledger at the first one, else resolved here.
        location = (record.staging_dir if record is not None else None) or staging.resolve_location(
            pipeline.staging_dir
        )[0]
        try:
            written, seen = staging_probe(pipeline, location)
            error = None
        except Exception as exc:  # the finding names it
            written, seen, error = None, 0, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        findings.append(judge_staging_shared(location, written, seen, socket.gethostname(), error))
    try:
        version = installed_spark_version()
    except ImportError:
        findings.append(
            Finding(
                "spark-connector",
                "warn",
                "pyspark is not installed where `eo doctor` runs: the connector version was not checked",
                "run the doctor where the prepare job is submitted from",
            )
        )
    else:
        findings.append(
            judge_connector(pipeline.spark_conf, version, cached_jars=_cached_connector_jars(version))
        )
    return DoctorReport(pipeline.name, tuple(findings))
