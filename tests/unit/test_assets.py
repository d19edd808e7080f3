"""Sink assets: the ``kafka://`` URI (the Kafka provider's scheme, one server written one
way), parse-time building without connections, the checkpoint ``extra`` the commit task
attaches to its outlet's event, and the task group's outlet wiring."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG, Asset
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_eo.assets import asset_server, checkpoint_extra, kafka_asset, sink_asset, topic_outlets
from airflow_provider_eo.ledger import Actor, Ledger, RangeSpec
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError, load_pipeline
from airflow_provider_eo.task_group import eo_pipeline_group

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.mark.parametrize(
    ("bootstrap", "server"),
    [
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("Broker-1.Example:9093,broker-0.example:9093", "broker-1.example:9093"),
        (" SASL_SSL://b1:9094 , b2:9094", "b1:9094"),
        ("b1", "b1:9092"),
        ("[::1]:29092", "[::1]:29092"),
    ],
)
def test_the_server_is_the_first_bootstrap_server_normalised(bootstrap: str, server: str) -> None:
    assert asset_server(bootstrap) == server
    asset = kafka_asset(bootstrap, "orders_clean")
    assert asset.uri == asset.name == f"kafka://{server}/orders_clean"


def test_the_uri_is_the_kafka_providers() -> None:
    from airflow.providers.apache.kafka.assets.kafka import create_asset

    assert kafka_asset("b1:9092,b2:9092", "t") == create_asset(server="b1:9092", topic="t")


@pytest.mark.parametrize(("bootstrap", "topic"), [("", "t"), (" , ", "t"), ("b1:x", "t"), ("b1:9092", "")])
def test_bad_servers_and_topics_are_refused(bootstrap: str, topic: str) -> None:
    with pytest.raises(ValueError):
        kafka_asset(bootstrap, topic)


def _pipeline(**kw: Any) -> Pipeline:
    base: dict[str, Any] = {"name": "orders", "source_topics": ["in"], "sink_topic": "out"}
    return Pipeline(**{**base, **kw})


def test_sink_asset_of_a_pipeline_without_a_server_in_code_names_the_fix() -> None:
    conn_only = _pipeline(kafka_conn_id="kafka_prod")
    with pytest.raises(PipelineConfigError, match=r"kafka_prod.*bootstrap='host:port'"):
        sink_asset(conn_only)
    assert sink_asset(conn_only, bootstrap="k1:9092").uri == "kafka://k1:9092/out"
    in_code = _pipeline(kafka={"bootstrap.servers": "k2:9092,k1:9092"}, kafka_conn_id="kafka_prod")
    assert sink_asset(in_code).uri == "kafka://k2:9092/out"


def test_sink_asset_of_a_reference_loads_the_pipeline(pipeline_ref: str) -> None:
    assert sink_asset(pipeline_ref).uri == "kafka://127.0.0.1:1/out"


def test_outlets_are_matched_by_topic_on_any_server() -> None:
    a, b = kafka_asset("x:1", "out"), kafka_asset("y:2", "out")
    outlets = [a, kafka_asset("x:1", "other"), Asset("out"), Asset(uri="s3://bucket/out"), b]
    assert topic_outlets(outlets, "out") == [a, b]


def _committed(pipeline_ref: str) -> Pipeline:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 3, 8), RangeSpec("in", 1, 0, 2)])
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=7, bytes_=7, shard_counts={0: 7}
        )
        committer = Actor(dag_id="eo_pipeline", run_id="scheduled__x", task_id="eo.commit", try_number=2)
        ledger.mark_committed(pipeline.name, 1, actor=committer)
    return pipeline


def test_the_commit_task_gives_its_sink_outlet_the_checkpoint(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    pipeline = _committed(pipeline_ref)
    sink, other = sink_asset(pipeline), Asset("report")
    context["outlet_events"] = events = OutletEventAccessors()
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id="1", outlets=[sink, other])
    op.execute(context)
    extra = events[sink].extra
    assert extra == {
        "pipeline": "orders",
        "checkpoint_id": 1,
        "sink_topic": "out",
        "records": 7,
        "ranges": [
            {"topic": "in", "partition": 0, "start": 3, "end": 8},
            {"topic": "in", "partition": 1, "start": 0, "end": 2},
        ],
        "dead_letters": None,
        "dead_letter_topic": None,
        "lineage": {
            "dag_id": "eo_pipeline",
            "run_id": "scheduled__x",
            "task_id": "eo.commit",
            "try_number": 2,
        },
        "ledger_lineage": 1,
        "committed_at": extra["committed_at"],
        # This task found it COMMITTED: it announces it again rather than not at all.
        "already_committed": True,
    }
    assert extra["committed_at"] and events[other].extra == {}
    with Ledger(pipeline.ledger_url) as ledger:
        cp = ledger.get(pipeline.name, 1)
    assert checkpoint_extra(pipeline, cp) == {**extra, "already_committed": False}


def test_a_commit_task_without_a_sink_outlet_emits_nothing(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    _committed(pipeline_ref)
    context["outlet_events"] = events = OutletEventAccessors()
    EoCommitOperator(
        task_id="commit", pipeline=pipeline_ref, checkpoint_id="1", outlets=[kafka_asset("b:1", "elsewhere")]
    ).execute(context)
    assert len(events) == 0


def test_the_group_wires_the_sink_outlet(pipeline_ref: str) -> None:
    given = kafka_asset("k:9092", "out")
    extra_outlet = Asset("report")
    with DAG("assets", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
        eo_pipeline_group(pipeline_ref, group_id="none")
        eo_pipeline_group(pipeline_ref, group_id="given", sink_asset=given)
        eo_pipeline_group(pipeline_ref, group_id="auto", sink_asset="auto")
        eo_pipeline_group(
            pipeline_ref, group_id="merged", sink_asset=given, commit_kwargs={"outlets": [extra_outlet]}
        )
    assert dag.get_task("none.commit").outlets == []
    assert dag.get_task("given.commit").outlets == [given]
    assert dag.get_task("auto.commit").outlets == [sink_asset(pipeline_ref)]
    assert dag.get_task("merged.commit").outlets == [extra_outlet, given]
    assert all(dag.get_task(f"{g}.{t}").outlets == [] for g in ("given", "auto") for t in ("plan", "prepare"))


def test_auto_skips_a_pipeline_known_only_by_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "eo_conn_only_pipeline.py").write_text(
        "from airflow_provider_eo.pipeline import Pipeline\n"
        "P = Pipeline(name='o', kafka_conn_id='kafka_prod', source_topics=['in'], sink_topic='out')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with DAG("conn_only", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
        eo_pipeline_group("eo_conn_only_pipeline:P", sink_asset="auto")
    assert dag.get_task("eo.commit").outlets == []
    assert "kafka_prod" in caplog.text and "bootstrap='host:port'" in caplog.text


def test_the_downstream_example_is_scheduled_on_the_pipeline_examples_outlet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.syspath_prepend(str(DAGS))
    monkeypatch.setenv("EO_KAFKA_BOOTSTRAP", "Kafka:9092")
    monkeypatch.setenv("EO_DEMO_SINK_TOPIC", "enriched")
    modules = {}
    for name in ("eo_pipeline", "eo_downstream", "eo_stream"):
        spec = importlib.util.spec_from_file_location(f"eo_assets_example_{name}", DAGS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[name] = module
    named = {
        "eo_pipeline": modules["eo_pipeline"].dag.get_task("eo.commit").outlets,
        "eo_downstream": list(modules["eo_downstream"].dag.timetable.asset_condition.objects),
        "eo_stream": modules["eo_stream"].commit_dag.get_task("commit").outlets,
    }
    # Airflow keeps an asset's watchers as the DAG file parsed last declares them: every
    # example file names the sink asset with the same watcher (stream-committed checkpoints).
    settings = set()
    for name, assets in named.items():
        assert [(a.name, a.uri) for a in assets] == [("kafka://kafka:9092/enriched",) * 2], name
        watchers = [(w.name, w.trigger.serialize()) for w in assets[0].watchers]
        for _, (_, kwargs) in watchers:  # the same recorded settings in every file
            settings.add(kwargs.pop("settings"))
            assert kwargs.pop("withheld") == [], name
        assert watchers == [
            (
                "eo_stream_commits_eo-demo",
                (
                    "airflow_provider_eo.triggers.stream.EoStreamCommitsTrigger",
                    {
                        "pipeline": "eo_demo_pipelines:demo_pipeline",
                        "ledger_conn_id": None,
                        "poll_interval": 5.0,
                    },
                ),
            )
        ], name
    (recorded,) = settings
    assert json.loads(recorded)["name"] == "eo-demo" and json.loads(recorded)["sink_topic"] == "enriched"


def test_the_backfill_announces_its_interval_once_with_every_checkpoint(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    import datetime as dt

    from airflow_provider_eo.core.backfill import BackfillResult
    from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState
    from airflow_provider_eo.operators.backfill import EoBackfillOperator

    live = load_pipeline(pipeline_ref)
    now = dt.datetime.now(dt.timezone.utc)
    done = [
        CheckpointRecord(
            pipeline="orders.bf.redo",
            checkpoint_id=i,
            state=CheckpointState.COMMITTED,
            lineage=1,
            ranges=(RangeSpec("in", 0, 10 * i, 10 * i + 10),),
            planned_at=now,
            records=10,
            time_filter=(0, 1000),
        )
        for i in (1, 2)
    ]
    result = BackfillResult(pipeline="orders", backfill_pipeline="orders.bf.redo", checkpoints=tuple(done))
    target = kafka_asset("k:9092", "redo")
    context["outlet_events"] = events = OutletEventAccessors()
    op = EoBackfillOperator(task_id="bf", pipeline=pipeline_ref, sink_topic="redo", outlets=[target])
    op._emit_asset_event(context, live, result, sink_topic="redo", start_ms=0, end_ms=1000)
    extra = events[target].extra
    assert extra["checkpoint_ids"] == [1, 2] and extra["records"] == 20 and extra["sink_topic"] == "redo"
    assert [c["checkpoint_id"] for c in extra["checkpoints"]] == [1, 2]
    assert all(c["sink_topic"] == "redo" and not c["already_committed"] for c in extra["checkpoints"])
    assert extra["start"] == "1970-01-01T00:00:00+00:00"
