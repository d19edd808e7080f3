"""The backfill pipeline's identity and the request checks that need no Kafka."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from airflow_provider_eo.core.backfill import (
    BackfillResult,
    backfill_pipeline,
    iso_ms,
    parse_instant,
    plan_backfill,
)
from airflow_provider_eo.errors import BackfillRefused
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline, backfill_name


def _live(tmp_path: Path, **kw: object) -> Pipeline:
    return Pipeline(
        name=str(kw.pop("name", "orders")),
        kafka={"bootstrap.servers": "127.0.0.1:1"},
        source_topics=["in"],
        sink_topic="out",
        transform="m:f",
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        consumer_group="orders-lag",
        max_pending=3,
        **kw,  # type: ignore[arg-type]
    )


def test_derived_pipeline_identity(tmp_path: Path) -> None:
    live = _live(tmp_path)
    bf = backfill_pipeline(live, "out-bf")
    assert bf.name == "orders.bf.out-bf"
    assert bf.sink_topic == "out-bf" and bf.transform == "m:f" and bf.backfill_of == "orders"
    assert bf.consumer_group == "eo.orders.bf.out-bf" and bf.group_id != live.group_id
    assert bf.max_pending == 1 and bf.source_topics == live.source_topics
    assert bf == backfill_pipeline(live, "out-bf")  # same (live, target): same identity
    assert bf.fingerprint() != live.fingerprint()
    other = backfill_pipeline(live, "out-bf", transform="m:g")
    assert other.name == bf.name and other.fingerprint() != bf.fingerprint()
    assert Pipeline.from_json(bf.to_json()) == bf


def test_live_fingerprint_unchanged_by_the_new_field(tmp_path: Path) -> None:
    # The digest of a live pipeline must stay what existing ledgers recorded.
    live = _live(tmp_path)
    doc = {"source_topics": ["in"], "sink_topic": "out", "transform": "m:f"}
    assert live.fingerprint() == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def test_long_names_get_a_readable_prefix_and_a_hash() -> None:
    name = backfill_name("p" * 90, "backfill-sink")
    assert len(name) <= 100 and name.startswith("p" * 40)
    assert name == backfill_name("p" * 90, "backfill-sink")
    assert name != backfill_name("p" * 90, "backfill-sink2")
    Pipeline(name=name, kafka={"bootstrap.servers": "x"}, source_topics=["a"], sink_topic="b")


def test_refusals_before_anything_is_written(tmp_path: Path) -> None:
    live = _live(tmp_path)
    with pytest.raises(BackfillRefused, match=r"live pipeline's own sink.*--allow-live-sink"):
        backfill_pipeline(live, "out")
    assert backfill_pipeline(live, "out", allow_live_sink=True).sink_topic == "out"
    with pytest.raises(BackfillRefused, match="needs a sink topic"):
        backfill_pipeline(live, "")
    with pytest.raises(BackfillRefused, match="source topics"):
        backfill_pipeline(live, "in")
    with pytest.raises(BackfillRefused, match="itself the backfill"):
        backfill_pipeline(backfill_pipeline(live, "x"), "y")
    with Ledger(live.ledger_url) as ledger:
        with pytest.raises(BackfillRefused, match="not in the ledger"):
            plan_backfill(live, ledger, 0, 10, sink_topic="bf")
        ledger.ensure_pipeline("orders", live.fingerprint())
        ledger.plan("orders", [RangeSpec("in", 0, 0, 5)])
        with pytest.raises(BackfillRefused, match="no COMMITTED checkpoint"):
            plan_backfill(live, ledger, 0, 10, sink_topic="bf")
        with pytest.raises(BackfillRefused, match=r"ends .* at or before it starts"):
            plan_backfill(live, ledger, 10, 10, sink_topic="bf")
        assert [p.name for p in ledger.list_pipelines()] == ["orders"]


def test_instants() -> None:
    assert parse_instant("1970-01-02") == 86_400_000
    assert parse_instant("1970-01-02T00:00:00Z") == 86_400_000
    assert parse_instant("1970-01-02T01:00:00+01:00") == 86_400_000
    assert iso_ms(86_400_000) == "1970-01-02T00:00:00Z"
    with pytest.raises(ValueError, match="not an ISO-8601"):
        parse_instant("yesterday")


def test_result_summary() -> None:
    r = BackfillResult("orders", "orders.bf.x", (), 0, "x", 0, 86_400_000)
    assert r.summary()["checkpoints"] == [] and r.summary()["end"] == "1970-01-02T00:00:00Z"


def test_a_spark_mode_backfill_commits_through_the_runner_or_says_it_commits_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """run_backfill hands its commits the caller's Spark runner and a fallback line (the
    commit's own decision: tests/unit/core/test_recover.py runs it against the fake Kafka);
    without ``say`` the line is a log warning."""
    import logging
    from types import SimpleNamespace

    from airflow_provider_eo.core import backfill, coordinator
    from airflow_provider_eo.ledger import CheckpointState

    live = _live(tmp_path, commit_mode="spark")
    prepared = SimpleNamespace(checkpoint_id=1, state=CheckpointState.PREPARED, records=3)
    plans = [prepared, None]
    monkeypatch.setattr(backfill, "plan_backfill", lambda *a, **k: plans.pop(0))
    calls: list[dict[str, object]] = []

    def commit(pipeline: Pipeline, ledger: object, checkpoint_id: int, **kw: object) -> object:
        calls.append(kw)
        fallback = kw["fallback"]
        assert callable(fallback)
        fallback("pipeline 'orders.bf.out-bf', checkpoint 1: commit_mode 'spark', but ...")
        return SimpleNamespace(checkpoint=prepared, published=3, note="", by_another=False)

    monkeypatch.setattr(coordinator, "commit_checkpoint", commit)
    runner = object()
    with caplog.at_level(logging.WARNING, logger=backfill.__name__):
        backfill.run_backfill(
            backfill.BackfillRequest(live, 0, 1, "out-bf"),
            None,  # type: ignore[arg-type]
            prepare=lambda *a: None,
            runner=runner,  # type: ignore[arg-type]
        )
    assert calls and calls[0]["runner"] is runner
    assert "commit_mode 'spark', but" in caplog.text
