"""Asset watchers whose pipeline module the triggerer cannot import (Airflow's triggerer
does not load DAG bundles): they run on the settings recorded when the DAG was parsed, with
secrets left out and supplied by connections, or fail visibly after a bounded number of tries
(an error event that fails the run it starts) instead of logging forever."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.assets import event_checkpoint, source_asset
from airflow_provider_eo.errors import WatcherSetupError
from airflow_provider_eo.pipeline import Pipeline, load_pipeline
from airflow_provider_eo.triggers import checkpoint, source
from airflow_provider_eo.triggers.checkpoint import resolve_watched, watcher_error
from airflow_provider_eo.triggers.source import EoSourceRecordsTrigger
from airflow_provider_eo.triggers.stream import EoStreamCommitsTrigger

LOG = logging.getLogger("test")
GONE = "eo_module_only_in_the_dags_folder:PIPELINE"  # what the triggerer cannot import


def secret_pipeline(tmp_path: Path, **kw: Any) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={
            "bootstrap.servers": "127.0.0.1:1",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "eo",
            "sasl.password": "pw-kafka",
            "ssl.key.pem": "-----BEGIN PRIVATE KEY-----",
        },
        source_topics=["in"],
        sink_topic="out",
        ledger_url="postgresql+psycopg://eo:pw-ledger@db:5432/eo",
        staging_dir=str(tmp_path / "staging"),
        **kw,
    )


def test_public_settings_leave_every_secret_out_and_read_back(tmp_path: Path) -> None:
    pipeline = secret_pipeline(tmp_path)
    settings, withheld = pipeline.public_settings()
    assert "pw-kafka" not in settings and "pw-ledger" not in settings and "PRIVATE KEY" not in settings
    assert withheld == ["sasl.password", "ssl.key.pem", "ledger_url.password"]
    back = Pipeline.from_json(settings)
    assert back.kafka == {k: v for k, v in pipeline.kafka.items() if k not in withheld}
    assert back.ledger_url == "postgresql+psycopg://eo@db:5432/eo"
    assert (back.name, back.source_topics, back.sink_topic) == ("orders", ["in"], "out")
    # Nothing to leave out: the same settings as to_json.
    plain = Pipeline(name="p", kafka={"bootstrap.servers": "b:1"}, source_topics=["a"], sink_topic="b")
    assert plain.public_settings() == (plain.to_json(), [])


def test_an_importable_module_is_the_pipelines_definition(pipeline_ref: str) -> None:
    recorded = Pipeline(
        name="stale", kafka={"bootstrap.servers": "x:1"}, source_topics=["x"], sink_topic="y"
    ).to_json()
    assert resolve_watched(pipeline_ref, recorded, [], kafka_conn_id=None, ledger_conn_id=None, log=LOG) == (
        load_pipeline(pipeline_ref)
    )


def test_a_module_the_triggerer_cannot_import_is_watched_from_the_recorded_settings(
    pipeline_ref: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings, withheld = load_pipeline(pipeline_ref).public_settings()
    with caplog.at_level(logging.INFO, logger="test"):
        got = resolve_watched(GONE, settings, withheld, kafka_conn_id=None, ledger_conn_id=None, log=LOG)
    assert got == load_pipeline(pipeline_ref)
    assert "watching with the settings recorded when the DAG was parsed" in caplog.text


def test_secrets_left_out_need_a_connection_else_the_error_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, withheld = secret_pipeline(tmp_path).public_settings()
    with pytest.raises(
        WatcherSetupError,
        match=r"'orders'.*leave out secrets \(sasl\.password, ssl\.key\.pem, "
        r"ledger_url\.password\).*kafka_conn_id / ledger_conn_id",
    ):
        resolve_watched(GONE, settings, withheld, kafka_conn_id=None, ledger_conn_id=None, log=LOG)
    # Connections supply them (looked up where the triggerer runs).
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_UNIT_WATCH_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k1:9092", "sasl.password": "pw"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_UNIT_WATCH_LEDGER",
        json.dumps({"conn_type": "eo_ledger", "host": str(tmp_path / "l.db")}),
    )
    got = resolve_watched(
        GONE,
        settings,
        withheld,
        kafka_conn_id="eo_unit_watch_kafka",
        ledger_conn_id="eo_unit_watch_ledger",
        log=LOG,
    )
    assert got.kafka["sasl.password"] == "pw" and got.ledger_url == f"sqlite:///{tmp_path / 'l.db'}"
    # A ledger connection does not supply the Kafka secrets.
    only_kafka = [k for k in withheld if k != "ledger_url.password"]
    with pytest.raises(WatcherSetupError, match=r"sasl\.password"):
        resolve_watched(
            GONE, settings, only_kafka, kafka_conn_id=None, ledger_conn_id="eo_unit_watch_ledger", log=LOG
        )


def test_an_old_watcher_without_settings_names_the_way_out(pipeline_ref: str) -> None:
    with pytest.raises(
        WatcherSetupError, match=r"cannot import .*does not load DAG bundles: install the pipeline"
    ):
        resolve_watched(GONE, None, [], kafka_conn_id=None, ledger_conn_id=None, log=LOG)


def test_source_asset_records_the_settings_without_secrets(pipeline_ref: str) -> None:
    asset = source_asset(pipeline_ref)
    (watcher,) = asset.watchers
    _, kwargs = watcher.trigger.serialize()
    assert Pipeline.from_json(kwargs["settings"]) == load_pipeline(pipeline_ref) and kwargs["withheld"] == []
    again = EoSourceRecordsTrigger(**kwargs)
    assert again.serialize()[1] == kwargs


def test_the_source_watcher_runs_from_the_recorded_settings(
    pipeline_ref: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, withheld = load_pipeline(pipeline_ref).public_settings()
    monkeypatch.setattr(
        source, "read_source_ends", lambda p, *, known: ({("in", 0): 3}, {("in", 0): known.get(("in", 0), 0)})
    )
    trigger = EoSourceRecordsTrigger(pipeline=GONE, poll_interval=0.01, settings=settings, withheld=withheld)

    async def first() -> Any:
        gen = trigger.run()
        try:
            return await asyncio.wait_for(gen.__anext__(), 10)
        finally:
            await gen.aclose()

    event = asyncio.run(first())
    assert event.payload["status"] == "source_records" and event.payload["pending"] == 3


@pytest.mark.parametrize("make", ["source", "stream_commits"])
def test_a_watcher_that_cannot_load_its_pipeline_fails_visibly_after_bounded_tries(
    make: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "RESOLVE_RETRY_S", 3600.0)
    trigger: Any = (
        EoSourceRecordsTrigger(pipeline=GONE, poll_interval=0.01)
        if make == "source"
        else EoStreamCommitsTrigger(pipeline=GONE, poll_interval=0.01)
    )
    tries = {"n": 0}
    real = trigger._resolve

    def counted() -> Any:
        tries["n"] += 1
        return real()

    monkeypatch.setattr(trigger, "_resolve", counted)

    async def scenario() -> tuple[Any, bool]:
        gen = trigger.run()
        event = await asyncio.wait_for(gen.__anext__(), 10)
        nxt = asyncio.ensure_future(gen.__anext__())
        done, _ = await asyncio.wait({nxt}, timeout=0.3)  # then quiet for RESOLVE_RETRY_S
        nxt.cancel()
        return event, bool(done)

    event, more = asyncio.run(scenario())
    assert tries["n"] == checkpoint.RESOLVE_TRIES and not more
    payload = event.payload
    assert payload["status"] == "error" and payload["pipeline"] == GONE
    assert "cannot import 'eo_module_only_in_the_dags_folder'" in payload["error"]
    # The run it starts: the plan task fails with it; a downstream DAG's reader raises it.
    extra = {"from_trigger": True, "payload": payload}
    assert (
        watcher_error(extra) == f"source watcher of {GONE!r} could not run: {payload['error']}"
        or make != "source"
    )
    with pytest.raises(WatcherSetupError, match="could not run"):
        event_checkpoint(extra)


def test_the_plan_task_fails_a_run_started_only_by_an_error_event() -> None:
    from airflow_provider_eo.operators.plan import _refuse_watcher_errors

    error = {
        "from_trigger": True,
        "payload": {"status": "error", "watcher": "w", "pipeline": "m:P", "error": "boom"},
    }
    good = {"from_trigger": True, "payload": {"status": "source_records", "pipeline": "orders"}}
    asset = "kafka://b:9092/in"
    with pytest.raises(
        WatcherSetupError, match="pipeline m:P: this run was started by an error event: w could not run: boom"
    ):
        _refuse_watcher_errors({"triggering_asset_events": {asset: [SimpleNamespace(extra=error)]}}, "m:P")  # type: ignore[arg-type]
    _refuse_watcher_errors(  # also started by a good event: it plans
        {"triggering_asset_events": {asset: [SimpleNamespace(extra=error), SimpleNamespace(extra=good)]}},  # type: ignore[arg-type]
        "m:P",
    )
    _refuse_watcher_errors({}, "m:P")  # type: ignore[arg-type]
