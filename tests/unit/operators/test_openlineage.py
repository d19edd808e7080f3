"""The eo operators' OpenLineage methods (what the OpenLineage provider's listener calls
around a task), and the Spark provider's OpenLineage parent-job properties reaching the
prepare's spark-submit command."""

from __future__ import annotations

import datetime as dt
import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from openlineage.client.serde import Serde

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.backfill import EoBackfillOperator
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.plan import EoPlanOperator
from airflow_provider_eo.operators.stream import EoStreamOperator
from airflow_provider_eo.operators.submit import EoSubmitOperator
from airflow_provider_eo.pipeline import load_pipeline

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
NAMESPACE = "kafka://127.0.0.1:1"  # the unit pipeline's bootstrap server


def _datasets(lineage: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return (
        [(d.namespace, d.name) for d in lineage.inputs],
        [(d.namespace, d.name) for d in lineage.outputs],
    )


def _facet(lineage: Any) -> dict[str, Any]:
    facet = Serde.to_dict(lineage.run_facets["eo"])
    facet.pop("_producer")
    facet.pop("_schemaURL")
    return facet


@pytest.fixture()
def planned(pipeline_ref: str) -> Iterator[Any]:
    """The unit pipeline with checkpoint 1 planned over in[0]:0-5."""
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        yield ledger


def _prepared(ledger: Ledger) -> None:
    ledger.mark_prepared(
        "orders", 1, attempt="a", staging_location="/x", records=4, bytes_=5, shard_counts={0: 4}
    )


def test_every_pipeline_operator_names_its_topics_at_start(pipeline_ref: str) -> None:
    ops = [
        EoPlanOperator(task_id="plan", pipeline=pipeline_ref),
        EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="3"),
        EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=3),
        EoStreamOperator(task_id="stream", pipeline=pipeline_ref),
    ]
    for op in ops:
        lineage = op.get_openlineage_facets_on_start()
        assert lineage is not None, op.task_id
        assert _datasets(lineage) == ([(NAMESPACE, "in")], [(NAMESPACE, "out")]), op.task_id
    # The checkpoint id a task was given is known before it reads the ledger; the plan has none.
    assert "checkpointId" not in _facet(ops[0].get_openlineage_facets_on_start())
    assert _facet(ops[1].get_openlineage_facets_on_start()) == {
        "pipeline": "orders",
        "sinkTopic": "out",
        "transactionalIdPrefix": "eo",
        "checkpointId": 3,
    }
    backfill = EoBackfillOperator(task_id="backfill", pipeline=pipeline_ref, sink_topic="out.backfill")
    assert _datasets(backfill.get_openlineage_facets_on_start()) == (
        [(NAMESPACE, "in")],
        [(NAMESPACE, "out.backfill")],
    )


def test_the_completion_event_has_the_checkpoint_as_the_task_left_it(
    pipeline_ref: str, planned: Ledger, context: dict[str, Any]
) -> None:
    _prepared(planned)
    op = EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="1")
    op.execute(context)  # already PREPARED: nothing submitted
    facet = _facet(op.get_openlineage_facets_on_complete(None))
    assert facet == {
        "pipeline": "orders",
        "sinkTopic": "out",
        "transactionalIdPrefix": "eo",
        "checkpointId": 1,
        "state": "PREPARED",
        "recordsPlanned": 5,
        "records": 4,
        "ranges": [{"topic": "in", "partition": 0, "start": 0, "end": 5}],
    }


def test_a_commit_reports_committed_and_its_records(
    pipeline_ref: str, planned: Ledger, context: dict[str, Any]
) -> None:
    _prepared(planned)
    planned.mark_committed("orders", 1)
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=1, commit_mode="local")
    op.execute(context)  # already COMMITTED
    lineage = op.get_openlineage_facets_on_complete(None)
    assert _datasets(lineage) == ([(NAMESPACE, "in")], [(NAMESPACE, "out")])
    facet = _facet(lineage)
    assert (facet["checkpointId"], facet["state"], facet["records"]) == (1, "COMMITTED", 4)


@pytest.fixture()
def connection_only_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A pipeline that names its cluster only through the ``kafka`` connection ``kafka_ol``
    (SASL settings with a password)."""
    name = f"eo_ol_pipeline_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from airflow_provider_eo.pipeline import Pipeline

            PIPELINE = Pipeline(
                name="orders",
                kafka_conn_id="kafka_ol",
                source_topics=["in"],
                sink_topic="out",
                ledger_url="sqlite:///{tmp_path}/ledger.db",
            )
            """
        )
    )
    extra = {
        "bootstrap.servers": "SASL_SSL://Broker.example:9093,broker-2.example:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "eo-user",
        "sasl.password": "ol-s3cret-pw",
    }
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_OL", json.dumps({"conn_type": "kafka", "extra": extra}))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:PIPELINE"
    sys.modules.pop(name, None)


def test_a_connection_only_pipeline_gets_its_namespace_from_the_connection_and_no_secret(
    connection_only_ref: str,
) -> None:
    op = EoCommitOperator(task_id="commit", pipeline=connection_only_ref, checkpoint_id=2)
    lineage = op.get_openlineage_facets_on_start()
    assert _datasets(lineage) == (
        [("kafka://broker.example:9093", "in")],
        [("kafka://broker.example:9093", "out")],
    )
    event = json.dumps(
        [Serde.to_dict(d) for d in [*lineage.inputs, *lineage.outputs]]
        + [Serde.to_dict(f) for f in lineage.run_facets.values()]
    )
    assert "ol-s3cret-pw" not in event and "eo-user" not in event and "SASL" not in event


def test_lineage_never_fails_a_task(caplog: pytest.LogCaptureFixture) -> None:
    op = EoPlanOperator(task_id="plan", pipeline="no_such_module_for_ol:P")
    assert op.get_openlineage_facets_on_start() is None
    assert op.get_openlineage_facets_on_failure(None) is None
    assert "no eo OpenLineage facets on start" in caplog.text


def test_the_spark_providers_parent_job_properties_reach_the_prepare_command(
    pipeline_ref: str, planned: Ledger, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    commands: list[list[str]] = []

    def submit(hook: SparkSubmitHook, application: str = "", **kwargs: Any) -> None:
        commands.append(hook._build_spark_submit_command(application))
        _prepared(planned)  # what the driver would do

    monkeypatch.setattr(SparkSubmitHook, "submit", submit)
    logical_date = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
    dag_run = SimpleNamespace(conf={}, logical_date=logical_date, run_after=logical_date, clear_number=0)
    context["ti"] = SimpleNamespace(
        **vars(context["ti"]), map_index=-1, dag_run=dag_run, get_template_context=lambda: {}
    )
    op = EoSubmitOperator(
        task_id="prepare",
        pipeline=pipeline_ref,
        checkpoint_id="1",
        packages=CONNECTOR,
        openlineage_inject_parent_job_info=True,
    )
    assert op.execute(context)["state"] == "PREPARED"

    (command,) = commands
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    from airflow.providers.openlineage.plugins.macros import lineage_run_id

    assert conf["spark.openlineage.parentJobName"] == "d.eo.x"
    assert conf["spark.openlineage.parentRunId"] == lineage_run_id(context["ti"])
    assert conf["spark.openlineage.rootParentJobName"] == "d"
    assert "spark.openlineage.parentJobNamespace" in conf


def test_a_stream_reports_what_it_finished(pipeline_ref: str) -> None:
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, commit="airflow")
    op._remember_summary({"checkpoints": 3, "records": 42, "reason": "duration"})
    facet = _facet(op.get_openlineage_facets_on_complete(None))
    assert (facet["commit"], facet["checkpoints"], facet["records"]) == ("airflow", 3, 42)
    assert "checkpointId" not in facet
