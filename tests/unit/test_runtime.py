"""The composition root (airflow_provider_eo/runtime.py): every branch of resolving a pipeline
reference (load, hand-off, connections read here, masking) and building its runtime."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo import names, runtime
from airflow_provider_eo.connections import ConnectionSettings, write_handoff
from airflow_provider_eo.errors import ConfigError, PipelineConfigError
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.runtime import build_runtime, resolve_pipeline, take_handoff


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> str:
    """``module:P``: a pipeline module on sys.path with settings ``kw``."""
    name = f"eo_runtime_{uuid.uuid4().hex[:8]}"
    if "kafka" not in kw and "kafka_conn_id" not in kw:
        kw["kafka"] = {"bootstrap.servers": "b:1"}
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    (tmp_path / f"{name}.py").write_text(
        "from airflow_provider_eo.pipeline import Pipeline\n"
        "P = Pipeline(name='orders', source_topics=['in'], sink_topic='out', "
        f"staging_dir={str(tmp_path / 'staging')!r}, {args})\n"
        "NOT_A_PIPELINE = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:P"


@pytest.fixture()
def no_lookup(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records every Airflow connection lookup instead of doing it."""
    import airflow_provider_eo.hooks.base as hooks_base

    calls: list[Any] = []

    def refuse(pipeline: Pipeline, **kw: Any) -> Any:
        calls.append((pipeline.connection_ids, kw))
        raise AssertionError("no connection should have been read")

    monkeypatch.setattr(hooks_base, "resolve_connections", refuse)
    return calls


@pytest.fixture()
def masked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What is registered with the task log's masker."""
    import airflow_provider_eo.version_compat as vc

    seen: list[str] = []
    monkeypatch.setattr(vc, "mask_secret", seen.append)
    return seen


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **doc: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(doc))


# -- 1. the reference ---------------------------------------------------------------------------


def test_a_reference_without_connections_is_loaded_and_nothing_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_lookup: list[Any]
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka={"bootstrap.servers": "b:1"})
    resolved = resolve_pipeline(ref)
    assert resolved.pipeline.name == "orders" and resolved.pipeline.kafka == {"bootstrap.servers": "b:1"}
    assert resolved.settings == ConnectionSettings() and not resolved.settings
    assert no_lookup == []


def test_a_pipeline_object_is_taken_as_it_is(no_lookup: list[Any]) -> None:
    pipeline = Pipeline(name="p", source_topics=["in"], sink_topic="out", kafka={"bootstrap.servers": "b:1"})
    assert resolve_pipeline(pipeline).pipeline is pipeline


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("eo_runtime_no_such_module:P", r"cannot import 'eo_runtime_no_such_module'"),
        ("os:path", r"'os:path' is not a Pipeline \(got module\)"),
        ("no_colon", r"'no_colon' is not MODULE:ATTR"),
    ],
)
def test_a_bad_reference_is_a_config_error(ref: str, message: str) -> None:
    with pytest.raises(PipelineConfigError, match=message):
        resolve_pipeline(ref)


def test_a_reference_to_something_else_names_what_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, monkeypatch).replace(":P", ":NOT_A_PIPELINE")
    with pytest.raises(PipelineConfigError, match=r"is not a Pipeline \(got int\)"):
        resolve_pipeline(ref)


# -- 2. connections read here ------------------------------------------------------------------


def test_the_pipelines_own_connections_are_read_and_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka_conn_id="eo_rt_kafka", ledger_conn_id="eo_rt_ledger")
    _conn(monkeypatch, "eo_rt_kafka", conn_type="kafka", extra={"bootstrap.servers": "k1:9092"})
    _conn(monkeypatch, "eo_rt_ledger", conn_type="eo_ledger", host=str(tmp_path / "l.db"))
    resolved = resolve_pipeline(ref)
    assert resolved.pipeline.kafka["bootstrap.servers"] == "k1:9092"
    assert resolved.pipeline.ledger_url == f"sqlite:///{tmp_path / 'l.db'}"
    assert resolved.pipeline.connection_ids == {}
    assert (resolved.settings.kafka_conn_id, resolved.settings.ledger_conn_id) == (
        "eo_rt_kafka",
        "eo_rt_ledger",
    )


def test_connection_ids_given_override_a_pipeline_that_names_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka={"bootstrap.servers": "mine:1"})
    _conn(monkeypatch, "eo_rt_task_kafka", conn_type="kafka", extra={"bootstrap.servers": "task:1"})
    resolved = resolve_pipeline(ref, kafka_conn_id="eo_rt_task_kafka")
    assert resolved.pipeline.kafka["bootstrap.servers"] == "task:1"
    assert resolved.settings.kafka_conn_id == "eo_rt_task_kafka"


def test_a_missing_connection_says_where_it_may_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _module(tmp_path, monkeypatch, ledger_conn_id="eo_rt_missing")
    monkeypatch.delenv("AIRFLOW_CONN_EO_RT_MISSING", raising=False)
    with pytest.raises(
        ConfigError, match=r"'orders'.*'eo_rt_missing' is not defined.*AIRFLOW_CONN_EO_RT_MISSING"
    ):
        resolve_pipeline(ref)


# -- 3. the hand-off ---------------------------------------------------------------------------

_HANDED = ConnectionSettings(
    kafka_conn_id="k",
    kafka={"bootstrap.servers": "handed:1"},
    ledger_conn_id="l",
    ledger_url="sqlite:////h.db",
)


def test_a_handoff_given_is_applied_and_nothing_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_lookup: list[Any]
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka_conn_id="k", ledger_conn_id="l")
    resolved = resolve_pipeline(ref, kafka_conn_id="k", ledger_conn_id="l", handoff=_HANDED)
    assert resolved.pipeline.kafka["bootstrap.servers"] == "handed:1"
    assert resolved.pipeline.ledger_url == "sqlite:////h.db" and resolved.pipeline.connection_ids == {}
    assert resolved.settings is _HANDED and no_lookup == []


def test_a_connection_the_handoff_lacks_is_read_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _module(tmp_path, monkeypatch, kafka_conn_id="k", ledger_conn_id="eo_rt_ledger2")
    _conn(monkeypatch, "eo_rt_ledger2", conn_type="eo_ledger", host=str(tmp_path / "l2.db"))
    handed = ConnectionSettings(kafka_conn_id="k", kafka={"bootstrap.servers": "handed:1"})
    pipeline = resolve_pipeline(ref, handoff=handed).pipeline
    assert pipeline.kafka["bootstrap.servers"] == "handed:1"
    assert pipeline.ledger_url == f"sqlite:///{tmp_path / 'l2.db'}"


def test_the_handoff_of_the_environment_is_read_once_and_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_lookup: list[Any]
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka_conn_id="k", ledger_conn_id="l")
    path = write_handoff(_HANDED)
    monkeypatch.setenv(names.CONNECTIONS_FILE_ENV, str(path))
    pipeline = resolve_pipeline(ref, handoff="env").pipeline
    assert pipeline.kafka["bootstrap.servers"] == "handed:1" and pipeline.ledger_url == "sqlite:////h.db"
    assert names.CONNECTIONS_FILE_ENV not in os.environ and not path.exists()
    assert take_handoff() is None


def test_the_environments_handoff_is_left_alone_when_the_reference_is_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_handoff(_HANDED)
    try:
        monkeypatch.setenv(names.CONNECTIONS_FILE_ENV, str(path))
        with pytest.raises(PipelineConfigError):
            resolve_pipeline("eo_runtime_no_such_module:P", handoff="env")
        assert os.environ[names.CONNECTIONS_FILE_ENV] == str(path) and path.exists()
    finally:
        take_handoff()
    assert not path.exists()


def test_without_handoff_the_environment_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI and the operators never take a hand-off (it is a Spark driver's)."""
    ref = _module(tmp_path, monkeypatch, kafka={"bootstrap.servers": "mine:1"})
    path = write_handoff(_HANDED)
    try:
        monkeypatch.setenv(names.CONNECTIONS_FILE_ENV, str(path))
        assert resolve_pipeline(ref).pipeline.kafka["bootstrap.servers"] == "mine:1"
        assert path.exists()
    finally:
        take_handoff()


# -- 4. masking ---------------------------------------------------------------------------------

_SECRET_KAFKA = {"bootstrap.servers": "b:1", "sasl.password": "kpw-31f0", "sasl.username": "svc"}


def test_mask_registers_every_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, masked: list[str]
) -> None:
    ref = _module(
        tmp_path, monkeypatch, kafka=_SECRET_KAFKA, ledger_url="postgresql+psycopg://eo:lpw-9a2b@db:5432/eo"
    )
    resolve_pipeline(ref, mask=True)
    assert sorted(masked) == ["kpw-31f0", "lpw-9a2b"]


def test_without_mask_nothing_is_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, masked: list[str]
) -> None:
    ref = _module(tmp_path, monkeypatch, kafka=_SECRET_KAFKA)
    resolve_pipeline(ref)
    assert masked == []


def test_the_operators_resolution_masks_the_pipelines_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through operators.base (what every task calls) and Airflow's real masker: the
    pipeline's own secrets (which no Airflow connection lookup has masked) are ``***`` in
    the task log."""
    from airflow.sdk.log import redact

    from airflow_provider_eo.operators.base import resolve_pipeline_settings

    kafka_pw, ledger_pw = (f"{what}-{uuid.uuid4().hex[:8]}" for what in ("kpw", "lpw"))
    ref = _module(
        tmp_path,
        monkeypatch,
        kafka={"bootstrap.servers": "b:1", "sasl.password": kafka_pw},
        ledger_url=f"postgresql+psycopg://eo:{ledger_pw}@db:5432/eo",
    )
    line = f"sasl.password={kafka_pw} url=postgresql+psycopg://eo:{ledger_pw}@db:5432/eo"
    assert str(redact(line)) == line
    pipeline, settings = resolve_pipeline_settings(ref)
    assert pipeline.kafka["sasl.password"] == kafka_pw and not settings
    masked = str(redact(line))
    assert kafka_pw not in masked and ledger_pw not in masked and "db:5432" in masked


# -- 5. the runtime -----------------------------------------------------------------------------


def _pipeline(**kw: Any) -> Pipeline:
    return Pipeline(
        name="p", source_topics=["in"], sink_topic="out", kafka={"bootstrap.servers": "b:1"}, **kw
    )


def test_a_local_commit_mode_has_no_runner_and_the_stager_starts_nothing() -> None:
    from airflow_provider_eo.spark.stager import SparkStager

    rt = build_runtime(_pipeline(commit_mode="local"), app_name="eo-x", ship=["m:P"])
    assert rt.runner is None
    assert isinstance(rt.stager, SparkStager)
    assert (rt.stager.app_name, rt.stager.ship, rt.stager._spark) == ("eo-x", ("m:P",), None)


def test_the_commit_mode_given_wins_and_a_spark_runner_gets_the_session() -> None:
    from airflow_provider_eo.spark.commit import SparkShardRunner

    session = object()
    rt = build_runtime(_pipeline(commit_mode="local"), spark=session, commit_mode="spark")  # type: ignore[arg-type]
    assert rt.pipeline.commit_mode == "spark"
    assert isinstance(rt.runner, SparkShardRunner) and rt.runner._spark is session
    assert rt.stager._spark is session  # type: ignore[attr-defined]


def test_a_bad_commit_mode_is_the_pipelines_error() -> None:
    with pytest.raises(ConfigError, match=r"pipeline 'p': commit_mode='nope'"):
        build_runtime(_pipeline(), commit_mode="nope")


def test_a_runtime_without_stager_says_so() -> None:
    rt = build_runtime(_pipeline(), stage=False)
    assert rt.staging is None
    with pytest.raises(ValueError, match="without a stager"):
        rt.stager  # noqa: B018


def test_the_coordinator_gets_the_runtimes_runner_and_metrics(tmp_path: Path) -> None:
    from airflow_provider_eo.core.coordinator import MetricsListener
    from airflow_provider_eo.ledger import Actor, Ledger

    class Sink:
        def count(self, name: str, value: int, *, pipeline: str) -> None: ...
        def seconds(self, name: str, value: float, *, pipeline: str) -> None: ...
        def gauge(self, name: str, value: float, *, pipeline: str) -> None: ...

    rt = build_runtime(_pipeline(commit_mode="spark"), stage=False, metrics=Sink())
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        actor = Actor.here()
        coordinator = rt.coordinator(ledger, actor)
    assert coordinator.runner is rt.runner and coordinator.actor is actor and coordinator.ledger is ledger
    assert [type(x) for x in coordinator.listeners] == [MetricsListener]
    assert build_runtime(_pipeline(), stage=False).coordinator(ledger).listeners == []


def test_importing_the_runtime_loads_neither_airflow_nor_spark() -> None:
    """A Spark driver that needs no connection never imports Airflow (and `eo --help` stays fast)."""
    import subprocess

    code = (
        "import sys, airflow_provider_eo.runtime as r; "
        "print(sorted(m for m in ('airflow', 'pyspark') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
    assert runtime.__all__


# -- 6. the sink's use: one hand-off for every batch's pipeline --------------------------------


def test_the_sink_keeps_the_handoff_for_the_pipelines_of_later_batches(
    monkeypatch: pytest.MonkeyPatch, no_lookup: list[Any]
) -> None:
    """A query's source topics may change between batches: each new pipeline gets the
    settings the task handed over, although the file was read (and deleted) at the first."""
    from airflow_provider_eo.streaming.sink import KafkaExactlyOnceSink

    sink = KafkaExactlyOnceSink("orders_agg", sink_topic="agg", kafka_conn_id="k", ledger_conn_id="l")
    path = write_handoff(_HANDED)
    monkeypatch.setenv(names.CONNECTIONS_FILE_ENV, str(path))
    first = sink._pipeline_for(["a"])
    assert not path.exists() and names.CONNECTIONS_FILE_ENV not in os.environ
    second = sink._pipeline_for(["a", "b"])
    for pipeline in (first, second):
        assert pipeline.kafka["bootstrap.servers"] == "handed:1" and pipeline.ledger_url == "sqlite:////h.db"
    assert second.source_topics == ("a", "b") and no_lookup == []
