"""The Structured Streaming sink as eo's commands see it (no Spark, no Kafka)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.streaming import KafkaExactlyOnceSink


def test_the_sink_is_a_pipeline_reference_once_its_query_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    sink = KafkaExactlyOnceSink(
        "agg", {"bootstrap.servers": "localhost:1"}, sink_topic="agg-out", ledger_url=url
    )
    module = types.ModuleType("eo_unit_sinks")
    module.AGG = sink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "eo_unit_sinks", module)
    with pytest.raises(ConfigError, match="has no batch of this query yet"):
        load_pipeline("eo_unit_sinks:AGG")
    with Ledger(url) as ledger:
        ledger.ensure_pipeline("agg", "f")
        ledger.plan("agg", [RangeSpec("orders", 0, 0, 5), RangeSpec("refunds", 0, 0, 2)], batch=("q1", 0))
    pipeline = load_pipeline("eo_unit_sinks:AGG")
    assert pipeline.name == "agg" and pipeline.sink_topic == "agg-out"
    assert tuple(pipeline.source_topics) == ("orders", "refunds")
    assert pipeline.ledger_url == url and pipeline.kafka["bootstrap.servers"] == "localhost:1"


@pytest.mark.parametrize("option", ["source_topics", "transform", "dead_letter_topic"])
def test_pipeline_settings_the_query_owns_are_refused(option: str) -> None:
    with pytest.raises(ConfigError, match=f"sink 'agg': '{option}' is not a setting"):
        KafkaExactlyOnceSink("agg", {"bootstrap.servers": "b:9092"}, sink_topic="out", **{option: "x"})


def test_a_bad_setting_fails_before_the_query_starts() -> None:
    with pytest.raises(ConfigError, match="pipeline name"):
        KafkaExactlyOnceSink("no spaces", {"bootstrap.servers": "b:9092"}, sink_topic="out")


def test_a_query_tasks_run_id_fits_the_ledger_and_names_the_try() -> None:
    from airflow_provider_eo.operators.query import query_run_id

    long = query_run_id("d" * 250, "manual__2026-11-26T10:42:23+00:00", "t" * 250, 12)
    assert len(long) <= 64 and long.endswith("-12")  # eo_stream_runs.run_id is 64 characters
    one, two = (query_run_id("dag", "run", "query", n) for n in (1, 2))
    assert one != two and one.startswith("af-query-")
    assert query_run_id("dag", "run-a", "query", 1) != query_run_id("dag", "run-b", "query", 1)


def test_a_second_query_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    sink = KafkaExactlyOnceSink(
        "agg",
        {"bootstrap.servers": "localhost:1"},
        sink_topic="agg-out",
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    sink.query = types.SimpleNamespace(isActive=True, id="q-1")  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="query q-1 still writes through this sink; stop it"):
        sink.start(None, str(tmp_path / "other-location"))  # type: ignore[arg-type]
    assert sink.checkpoint_location is None  # nothing of the refused start was kept


def test_close_waits_for_the_run_end_the_listener_began() -> None:
    """The query's listener ends the run on its own thread when the query terminates; close()
    right after ``awaitTermination()`` returns only once that end is written (the process
    exits next, and a half-written end would leave the run RUNNING in the ledger)."""
    import threading

    sink = KafkaExactlyOnceSink("agg", {"bootstrap.servers": "b:9092"}, sink_topic="out")
    events: list[str] = []
    entered, release = threading.Event(), threading.Event()

    class SlowRun:
        def end(self, error: str | None) -> None:
            entered.set()
            assert release.wait(10)  # the ledger write, held until the test lets it go
            events.append(f"ended {error}")

    class Terminated:
        id = "q-1"
        isActive = False

        def exception(self) -> None:
            return None

    listeners: list[Any] = []
    spark = types.SimpleNamespace(streams=types.SimpleNamespace(addListener=listeners.append))
    sink._listen(spark)
    sink._run = SlowRun()  # type: ignore[assignment]
    sink.query = Terminated()  # type: ignore[assignment]
    event = types.SimpleNamespace(id="q-1", exception=None)
    listener = threading.Thread(target=listeners[0].onQueryTerminated, args=(event,))
    listener.start()
    assert entered.wait(5)
    closer = threading.Thread(target=lambda: (sink.close(), events.append("closed")))
    closer.start()
    closer.join(timeout=1.0)  # close() must still be waiting for the listener's end
    release.set()
    closer.join(5)
    listener.join(5)
    assert events == ["ended None", "closed"]  # written before close() returned, and once
