"""EoQueryOperator, deferrable: the application started detached, the wait in the triggerer,
a retry re-attaching to its earlier try's live query, and the end read from the ledger
(spark-submit and the launcher faked; the real run is the Airflow integration test's)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

import airflow_provider_eo.detach as detach
import airflow_provider_eo.operators.query as query_mod
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.operators.query import (
    EoQueryOperator,
    QueryRunFailed,
    query_run_id,
    query_run_prefix,
)
from airflow_provider_eo.triggers.stream import EoStreamRunTrigger
from airflow_provider_eo.version_compat import AirflowException, AirflowFailException


@pytest.fixture()
def sink_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    module = f"eo_test_sink_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from airflow_provider_eo.streaming import KafkaExactlyOnceSink

            SINK = KafkaExactlyOnceSink(
                "agg",
                {{"bootstrap.servers": "127.0.0.1:1"}},
                sink_topic="out",
                ledger_url="sqlite:///{tmp_path}/ledger.db",
                staging_dir="{tmp_path}/staging",
            )
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{module}:SINK"
    sys.modules.pop(module, None)


@pytest.fixture()
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The detached launcher faked: records what it would have spark-submitted."""
    seen: list[dict[str, Any]] = []

    def launch(hook: Any, application: str, **kwargs: Any) -> int:
        seen.append({"hook": hook, "application": application, **kwargs})
        return 4242

    monkeypatch.setattr(detach, "launch_detached", launch)
    monkeypatch.setattr(query_mod, "spark_target", lambda task: ("local[2]", "client"))
    monkeypatch.setattr(query_mod, "add_task_time_jars", lambda task, name: None)
    monkeypatch.setattr(EoQueryOperator, "_get_hook", lambda self: SimpleNamespace(env_vars=self.env_vars))
    return seen


def _context(try_number: int) -> dict[str, Any]:
    return {"ti": SimpleNamespace(dag_id="d", run_id="r1", task_id="query", try_number=try_number)}


def _operator(sink_ref: str) -> EoQueryOperator:
    return EoQueryOperator(task_id="query", sink=sink_ref, application="/opt/app.py", deferrable=True)


def test_deferrable_starts_the_application_detached_and_waits_in_the_triggerer(
    sink_ref: str, launches: list[dict[str, Any]]
) -> None:
    with pytest.raises(TaskDeferred) as deferred:
        _operator(sink_ref).execute(_context(1))  # type: ignore[arg-type]
    (launch,) = launches
    run_id = query_run_id("d", "r1", "query", 1)
    assert launch["application"] == "/opt/app.py" and launch["run_id"] == run_id
    assert launch["pipeline"] == "agg" and launch["hook"].env_vars["EO_STREAM_RUN_ID"] == run_id
    trigger = deferred.value.trigger
    assert isinstance(trigger, EoStreamRunTrigger) and (trigger.pipeline, trigger.run_id) == ("agg", run_id)


def test_a_retry_reattaches_to_its_earlier_trys_live_query(
    sink_ref: str, launches: list[dict[str, Any]]
) -> None:
    op = _operator(sink_ref)
    url = op._load_sink().base_pipeline().ledger_url
    first = query_run_id("d", "r1", "query", 1)
    with Ledger(url) as ledger:
        ledger.ensure_pipeline("agg", "fp")
        ledger.register_stream_run("agg", run_id=first, host="h", pid=1, commit_mode="inline", heartbeat_s=30)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context(2))  # type: ignore[arg-type]
    assert launches == [] and deferred.value.trigger.run_id == first  # no second query
    assert first.startswith(query_run_prefix("d", "r1", "query"))


def test_a_live_query_of_anyone_else_is_refused(sink_ref: str, launches: list[dict[str, Any]]) -> None:
    op = _operator(sink_ref)
    with Ledger(op._load_sink().base_pipeline().ledger_url) as ledger:
        ledger.ensure_pipeline("agg", "fp")
        ledger.register_stream_run(
            "agg", run_id="cli-run", host="h", pid=1, commit_mode="inline", heartbeat_s=30
        )
    with pytest.raises(AirflowException, match=r"a query already runs through it.*cli-run.*eo stream-stop"):
        op.execute(_context(1))  # type: ignore[arg-type]
    assert launches == []


def test_the_end_comes_from_the_ledger(sink_ref: str) -> None:
    op = _operator(sink_ref)
    url = op._load_sink().base_pipeline().ledger_url
    with Ledger(url) as ledger:
        ledger.ensure_pipeline("agg", "fp")
        for run in ("ok", "bad"):
            ledger.register_stream_run(
                "agg", run_id=run, host="h", pid=1, commit_mode="inline", heartbeat_s=30
            )
            ledger.end_stream_run(
                run,
                state="ENDED" if run == "ok" else "FAILED",
                reason="stop requested" if run == "ok" else "boom",
                error=None if run == "ok" else "KafkaException: boom",
            )
    done = op.execute_complete({}, {"status": "success", "run_id": "ok", "run": {"pipeline": "agg"}})  # type: ignore[arg-type]
    assert done["state"] == "ENDED" and done["run_id"] == "ok"
    with pytest.raises(QueryRunFailed, match=r"(?s)run bad is FAILED: boom.*KafkaException: boom"):
        op.execute_complete({}, {"status": "failed", "run_id": "bad", "reason": "boom"})  # type: ignore[arg-type]


def test_deferrable_refuses_cluster_mode(
    sink_ref: str, launches: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(query_mod, "spark_target", lambda task: ("yarn", "cluster"))
    with pytest.raises(AirflowFailException, match="deferrable=False"):
        _operator(sink_ref).execute(_context(1))  # type: ignore[arg-type]
