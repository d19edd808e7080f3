"""Pipeline and Startup validate themselves: every impossible setting is refused with a
message naming the pipeline and what to change."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL
from airflow_provider_eo.pipeline import (
    BROKER_MAX_TRANSACTION_TIMEOUT_MS,
    Pipeline,
    PipelineConfigError,
    Startup,
    load_pipeline,
)


def _pipeline(**overrides: Any) -> Pipeline:
    settings: dict[str, Any] = {
        "name": "orders",
        "kafka": {"bootstrap.servers": "127.0.0.1:9092"},
        "source_topics": ["in"],
        "sink_topic": "out",
    }
    settings.update(overrides)
    return Pipeline(**settings)


def test_defaults_are_valid() -> None:
    p = _pipeline()
    assert p.ledger_url == DEFAULT_LEDGER_URL
    assert p.group_id == "eo.orders"
    assert _pipeline(consumer_group="g").group_id == "g"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"name": ""}, "pipeline name '' is invalid"),
        ({"name": "has space"}, "is invalid"),
        ({"name": "x" * 101}, "is invalid"),
        ({"name": "-leading"}, "is invalid"),
        ({"source_topics": "in"}, r"source_topics must be a list, e.g. \['in'\]"),
        ({"source_topics": []}, "source_topics is empty"),
        ({"sink_topic": "in"}, "is also a source topic"),
        ({"kafka": {}}, "needs 'bootstrap.servers'"),
        ({"max_records_per_checkpoint": 0}, "max_records_per_checkpoint must be >= 1"),
        ({"commit_shards": 0}, "commit_shards must be >= 1"),
        ({"max_pending": 0}, "max_pending must be >= 1"),
        ({"transaction_timeout_ms": 999}, "must be between 1000"),
        ({"transaction_timeout_ms": BROKER_MAX_TRANSACTION_TIMEOUT_MS + 1}, "must be between 1000"),
        (
            {"kafka": {"bootstrap.servers": "b", "message.timeout.ms": 60_000}},
            r"message.timeout.ms \(60000\) must be below transaction_timeout_ms \(60000\)",
        ),
        ({"on_data_loss": "ignore"}, "on_data_loss must be 'fail' or 'skip'"),
        ({"transform": "mod.func"}, "must be 'module:function'"),
    ],
)
def test_impossible_settings_are_refused(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineConfigError, match=match) as info:
        _pipeline(**overrides)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    "key", ["transactional.id", "enable.idempotence", "isolation.level", "enable.auto.commit", "group.id"]
)
def test_protocol_keys_are_refused_in_the_kafka_config(key: str) -> None:
    with pytest.raises(PipelineConfigError, match=f"pipeline 'orders': remove '{key}'"):
        _pipeline(kafka={"bootstrap.servers": "b", key: "x"})


def test_boundaries_are_accepted() -> None:
    _pipeline(name="a", transaction_timeout_ms=1_000)
    _pipeline(name="x" * 100, transaction_timeout_ms=BROKER_MAX_TRANSACTION_TIMEOUT_MS)
    _pipeline(kafka={"bootstrap.servers": "b", "message.timeout.ms": 59_999})


@pytest.mark.parametrize(
    ("startup", "match"),
    [
        ({"mode": "newest"}, "startup mode 'newest' is unknown"),
        ({"mode": "timestamp"}, "needs timestamp_ms"),
        ({"mode": "offsets"}, "needs offsets="),
        ({"mode": "offsets", "offsets": {}}, "needs offsets="),
    ],
)
def test_startup_validates_itself(startup: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineConfigError, match=match):
        Startup(**startup)


def test_fingerprint_covers_what_must_not_change_silently() -> None:
    base = _pipeline(source_topics=["a", "b"], transform="m:f")
    assert dataclasses.replace(base, name="renamed").fingerprint() == base.fingerprint()
    assert base.fingerprint() == _pipeline(source_topics=["b", "a"], transform="m:f").fingerprint()
    assert (
        base.fingerprint()
        == _pipeline(source_topics=["a", "b"], transform="m:f", max_records_per_checkpoint=5).fingerprint()
    )
    assert base.fingerprint() != _pipeline(source_topics=["a"], transform="m:f").fingerprint()
    assert (
        base.fingerprint()
        != _pipeline(source_topics=["a", "b"], sink_topic="o2", transform="m:f").fingerprint()
    )
    assert base.fingerprint() != _pipeline(source_topics=["a", "b"]).fingerprint()


def test_json_round_trip_keeps_every_setting() -> None:
    p = _pipeline(
        transform="m:f",
        startup=Startup(mode="offsets", offsets={"in": {0: 5, 2: 7}}),
        consumer_group="g",
        commit_shards=3,
        on_data_loss="skip",
        spark_conf={"spark.master": "local[2]"},
        keep_committed_staging=2,
        max_pending=2,
    )
    assert Pipeline.from_json(p.to_json()) == p
    timestamp = _pipeline(startup=Startup(mode="timestamp", timestamp_ms=123))
    assert Pipeline.from_json(timestamp.to_json()) == timestamp


def test_load_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = "eo_unit_pipeline_module"
    (tmp_path / f"{module}.py").write_text(
        "from airflow_provider_eo.pipeline import Pipeline\n"
        "P = Pipeline(name='p', kafka={'bootstrap.servers': 'b'}, source_topics=['i'], sink_topic='o')\n"
        "def make():\n    return P\n"
        "NOT_A_PIPELINE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_pipeline(f"{module}:P").name == "p"
        assert load_pipeline(f"{module}:make").name == "p"
        with pytest.raises(PipelineConfigError, match="is not a Pipeline"):
            load_pipeline(f"{module}:NOT_A_PIPELINE")
        with pytest.raises(PipelineConfigError, match="is not MODULE:ATTR"):
            load_pipeline(module)
        with pytest.raises(PipelineConfigError, match="cannot import 'eo_no_such_module'"):
            load_pipeline("eo_no_such_module:P")
    finally:
        sys.modules.pop(module, None)
