"""The OpenLineage lineage of an eo task as plain data (namespace, topics, the eo facet's
fields) and as the OpenLineage provider's ``OperatorLineage``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from airflow_provider_eo import openlineage as ol
from airflow_provider_eo.ledger.records import CheckpointRecord, CheckpointState, CommitPlan, RangeSpec
from airflow_provider_eo.pipeline import Pipeline


def _pipeline(**kwargs: Any) -> Pipeline:
    settings: dict[str, Any] = {
        "name": "orders",
        "kafka": {"bootstrap.servers": "Broker-1.example:9093,broker-2.example:9093"},
        "source_topics": ["in-a", "in-b"],
        "sink_topic": "out",
        "ledger_url": "sqlite:///unused.db",
        "transactional_id_prefix": "team",
        **kwargs,
    }
    return Pipeline(**settings)


def _checkpoint(ranges: int = 2, **kwargs: Any) -> CheckpointRecord:
    settings: dict[str, Any] = {
        "pipeline": "orders",
        "checkpoint_id": 7,
        "state": CheckpointState.PREPARED,
        "lineage": 1,
        "ranges": tuple(RangeSpec("in-a", p, 10, 15) for p in range(ranges)),
        "planned_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        "records": 9,
        "commit_plan": CommitPlan(
            sink_topic="out",
            sink_partitions=3,
            transactional_id_prefix="pinned",
            marker_group="g",
            shard_of_partition=(0, 0, 0),
        ),
        **kwargs,
    }
    return CheckpointRecord(**settings)


@pytest.mark.parametrize(
    ("bootstrap", "namespace"),
    [
        ("127.0.0.1:9092", "kafka://127.0.0.1:9092"),
        ("SASL_SSL://Broker-1.example:9093, broker-2.example:9093", "kafka://broker-1.example:9093"),
        ("broker", "kafka://broker:9092"),
        ("[::1]:19092", "kafka://[::1]:19092"),
        # Anything before '@' is not a server: never part of a namespace.
        ("user:s3cret@broker:9093", "kafka://broker:9093"),
    ],
)
def test_the_namespace_is_the_first_bootstrap_server_as_the_naming_spec_writes_it(
    bootstrap: str, namespace: str
) -> None:
    assert ol.kafka_namespace(bootstrap) == namespace
    from openlineage.client.naming.dataset import Kafka

    host, port = namespace.removeprefix("kafka://").rsplit(":", 1)
    assert Kafka(bootstrap_server_host=host, port=port, topic="t").get_namespace() == namespace


def test_the_sink_dataset_is_the_one_the_kafka_provider_converts_the_sink_asset_into() -> None:
    from airflow.providers.apache.kafka.assets.kafka import convert_asset_to_openlineage

    from airflow_provider_eo.assets import sink_asset

    pipeline = _pipeline()
    converted = convert_asset_to_openlineage(sink_asset(pipeline), None)
    _, outputs = ol.task_lineage(pipeline).datasets()
    assert outputs == [(converted.namespace, converted.name)]


def test_a_pipeline_without_a_server_names_no_dataset() -> None:
    lineage = ol.task_lineage(_pipeline(kafka={}, kafka_conn_id="kafka_prod"))
    assert lineage.namespace is None
    assert lineage.datasets() == ([], [])
    assert lineage.facet["pipeline"] == "orders"


def test_before_the_ledger_is_read_the_facet_has_the_pipeline_and_what_the_task_was_given() -> None:
    lineage = ol.task_lineage(_pipeline(), checkpointId=7, records=None)
    assert lineage.datasets() == (
        [("kafka://broker-1.example:9093", "in-a"), ("kafka://broker-1.example:9093", "in-b")],
        [("kafka://broker-1.example:9093", "out")],
    )
    assert lineage.facet == {
        "pipeline": "orders",
        "sinkTopic": "out",
        "transactionalIdPrefix": "team",
        "checkpointId": 7,
    }


def test_a_checkpoint_gives_its_ranges_records_state_and_pinned_prefix() -> None:
    facet = ol.task_lineage(_pipeline(), checkpoint=_checkpoint(), state="COMMITTED").facet
    assert facet == {
        "pipeline": "orders",
        "sinkTopic": "out",
        # The prefix the checkpoint's commit plan pinned, not the pipeline's current one.
        "transactionalIdPrefix": "pinned",
        "checkpointId": 7,
        "state": "COMMITTED",
        "recordsPlanned": 10,
        "records": 9,
        "ranges": [
            {"topic": "in-a", "partition": 0, "start": 10, "end": 15},
            {"topic": "in-a", "partition": 1, "start": 10, "end": 15},
        ],
    }


def test_many_partitions_are_capped_and_counted() -> None:
    facts = ol.checkpoint_facts(_checkpoint(ranges=ol.MAX_FACET_RANGES + 5, commit_plan=None))
    assert len(facts["ranges"]) == ol.MAX_FACET_RANGES
    assert facts["rangesOmitted"] == 5
    assert facts["recordsPlanned"] == 5 * (ol.MAX_FACET_RANGES + 5)
    assert "transactionalIdPrefix" not in facts


def test_a_backfill_writes_its_target_topic() -> None:
    lineage = ol.task_lineage(_pipeline(), sink_topic="out.backfill", checkpointIds=[1, 2])
    assert lineage.outputs == ("out.backfill",)
    assert lineage.facet["sinkTopic"] == "out.backfill"
    assert lineage.facet["checkpointIds"] == [1, 2]


def test_operator_lineage_carries_kafka_datasets_and_the_eo_facet() -> None:
    from openlineage.client.serde import Serde

    import airflow_provider_eo

    lineage = ol.task_lineage(_pipeline(), checkpoint=_checkpoint())
    result = ol.to_operator_lineage(lineage)
    assert result is not None
    assert [(d.namespace, d.name) for d in result.inputs] == lineage.datasets()[0]
    assert [(d.namespace, d.name) for d in result.outputs] == lineage.datasets()[1]
    facet = Serde.to_dict(result.run_facets[ol.FACET_NAME])
    assert (
        facet.pop("_producer")
        == f"https://pypi.org/project/airflow-provider-eo/{airflow_provider_eo.__version__}"
    )
    assert facet.pop("_schemaURL").startswith("https://openlineage.io/spec/")
    assert facet == json.loads(json.dumps(dict(lineage.facet)))


def test_without_the_openlineage_provider_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ol, "openlineage_installed", lambda: False)
    assert ol.to_operator_lineage(ol.task_lineage(_pipeline())) is None
