"""The prepare entry point's pure parts: connection overrides, the entry module."""

from __future__ import annotations

import json

from airflow_provider_eo import names
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import prepare

PIPELINE = Pipeline(
    name="orders",
    kafka={"bootstrap.servers": "a:9092", "client.id": "x"},
    source_topics=["in"],
    sink_topic="out",
    ledger_url="sqlite:////tmp/l.db",
)


def test_no_overrides_keep_the_pipeline() -> None:
    assert prepare.apply_overrides(PIPELINE, None) is PIPELINE
    assert prepare.apply_overrides(PIPELINE, "") is PIPELINE


def test_overrides_merge_kafka_and_replace_the_ledger() -> None:
    doc = {"kafka": {"bootstrap.servers": "b:9093", "sasl.password": "s"}, "ledger_url": "postgresql://h/db"}
    p = prepare.apply_overrides(PIPELINE, json.dumps(doc))
    assert dict(p.kafka) == {"bootstrap.servers": "b:9093", "client.id": "x", "sasl.password": "s"}
    assert p.ledger_url == "postgresql://h/db"
    only_kafka = prepare.apply_overrides(PIPELINE, json.dumps({"kafka": {"client.id": "y"}}))
    assert only_kafka.ledger_url == PIPELINE.ledger_url and only_kafka.kafka["client.id"] == "y"


def test_entry_module_exports() -> None:
    assert callable(prepare.main) and callable(prepare.apply_overrides)
    assert names.PIPELINE_OVERRIDES_ENV == "EO_PIPELINE_OVERRIDES_JSON"
