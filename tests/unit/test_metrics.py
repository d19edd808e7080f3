"""metrics.py: eo.* metrics through Airflow's own StatsD logger (name validation, tag modes)
to a UDP listener on 127.0.0.1, and the per-pipeline names plain StatsD needs."""

from __future__ import annotations

import datetime as dt

import statsd  # the statsd extra (dev group): missing, the tests fail rather than skip
from eo_harness import poll_until
from eo_statsd import statsd_listener

from airflow_provider_eo.core.metrics import METRIC_NAMES, PipelineMetrics
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, RangeSpec
from airflow_provider_eo.metrics import AirflowStatsSink, per_pipeline_name


def _airflow_statsd(port: int, *, influx: bool) -> object:
    """Airflow's StatsD logger as the Task SDK builds it from [metrics] (prefix airflow)."""
    from airflow.sdk._shared.observability.metrics.statsd_logger import get_statsd_logger

    return get_statsd_logger(
        stats_class=statsd.StatsClient,
        host="127.0.0.1",
        port=port,
        prefix="airflow",
        influxdb_tags_enabled=influx,
        statsd_influxdb_enabled=influx,
    )


def _cp() -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="orders.eu",
        checkpoint_id=1,
        state=CheckpointState.COMMITTED,
        lineage=1,
        ranges=(RangeSpec("in", 0, 0, 10),),
        planned_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        records=10,
        dead_letters=2,
    )


def _send_all(sink: AirflowStatsSink) -> None:
    metrics = PipelineMetrics(sink, "orders.eu")
    metrics.committed(_cp(), 1.5)
    metrics.prepared(2.0)
    metrics.aborted()
    metrics.lag(3)


def test_influxdb_mode_tags_every_metric_with_the_pipeline() -> None:
    with statsd_listener() as listener:
        _send_all(AirflowStatsSink(_airflow_statsd(listener.port, influx=True), name_per_pipeline=False))
        assert poll_until(lambda: len(listener.metrics("airflow.eo.")) >= 6, timeout=10)
        got = {m.name: m for m in listener.metrics("airflow.eo.")}
    assert set(got) == {f"airflow.{n}" for n in METRIC_NAMES}
    assert all(m.tags == {"pipeline": "orders.eu"} for m in got.values())
    records = got["airflow.eo.checkpoint.records"]
    assert (records.kind, records.value) == ("c", 10)
    assert got["airflow.eo.dead_letters"].value == 2
    assert (got["airflow.eo.commit.seconds"].kind, got["airflow.eo.commit.seconds"].value) == ("ms", 1500)
    assert (got["airflow.eo.lag.records"].kind, got["airflow.eo.lag.records"].value) == ("g", 3)


def test_plain_statsd_also_names_the_pipeline() -> None:
    with statsd_listener() as listener:
        _send_all(AirflowStatsSink(_airflow_statsd(listener.port, influx=False), name_per_pipeline=True))
        assert poll_until(lambda: len(listener.metrics("airflow.eo.")) >= 12, timeout=10)
        names = {m.name for m in listener.metrics("airflow.eo.")}
    # Tags are dropped: the aggregate name, and one per pipeline ('.' in it becomes '__').
    assert names == {f"airflow.{n}" for n in METRIC_NAMES} | {f"airflow.{n}.orders__eu" for n in METRIC_NAMES}
    assert per_pipeline_name("eo.dead_letters", "orders.eu") == "eo.dead_letters.orders__eu"


class _Raising:
    def __getattr__(self, name: str) -> object:
        raise RuntimeError("no backend")


def test_a_backend_that_raises_fails_nothing() -> None:
    _send_all(AirflowStatsSink(_Raising(), name_per_pipeline=True))


def test_a_process_airflow_did_not_start_initializes_stats_from_its_environment() -> None:
    """What a Spark driver does: a fresh interpreter whose only Airflow settings are the
    [metrics] variables it inherited sends through Airflow's StatsD backend (plain StatsD
    here: the per-pipeline name is sent too)."""
    import os
    import subprocess
    import sys

    from eo_statsd import statsd_env

    code = (
        "from airflow_provider_eo.metrics import AirflowStatsSink\n"
        "AirflowStatsSink().count('eo.checkpoint.records', 5, pipeline='orders')\n"
    )
    with statsd_listener() as listener:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__METRICS")}
        env.update(statsd_env(listener.port, tags="none"))
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert poll_until(lambda: len(listener.metrics("airflow.eo.")) >= 2, timeout=10), proc.stderr
        got = {(m.name, m.value) for m in listener.metrics("airflow.eo.")}
    # Plain StatsD (no tag mode): the aggregate name and the per-pipeline one.
    assert got == {("airflow.eo.checkpoint.records", 5), ("airflow.eo.checkpoint.records.orders", 5)}
