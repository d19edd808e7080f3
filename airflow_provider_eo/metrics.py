"""Pipeline metrics through Airflow's ``Stats``: StatsD, Datadog or OpenTelemetry, as the
deployment's ``[metrics]`` section configures (docs/observability.md, "Metrics").

The names are :mod:`airflow_provider_eo.core.metrics`'s (``eo.checkpoint.records`` ...),
each sent with the tag ``pipeline=<name>``. Plain StatsD has no tags (Airflow drops them
unless ``statsd_influxdb_enabled`` or ``statsd_datadog_enabled`` is on), so there each
metric is also sent once more with the pipeline in its name, as Airflow does for its own
per-DAG metrics: ``eo.checkpoint.records.<pipeline>`` (a ``.`` in the name becomes
``__``, so it stays one segment).

Used by the operators (Airflow side) and by the Spark drivers they start (apps); nothing
here raises into a caller: a metric that cannot be sent is logged.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_provider_eo.core.metrics import PipelineMetrics


def _plain_statsd() -> bool:
    """Whether metrics go to StatsD without tags (no InfluxDB or Datadog tag mode)."""
    from airflow_provider_eo.version_compat import airflow_conf

    conf = airflow_conf()

    def flag(key: str) -> bool:
        return bool(conf.getboolean("metrics", key, fallback=False))

    return flag("statsd_on") and not flag("statsd_influxdb_enabled") and not flag("statsd_datadog_enabled")


def per_pipeline_name(name: str, pipeline: str) -> str:
    """``name`` with the pipeline as its last segment, for backends without tags."""
    return f"{name}.{pipeline.replace('.', '__')}"


class AirflowStatsSink:
    """A :class:`~airflow_provider_eo.core.metrics.MetricsSink` over Airflow's ``Stats``.

    :param stats: the ``Stats`` to use (default: Airflow's, found and initialized on first
        use, see :func:`~airflow_provider_eo.version_compat.airflow_stats`).
    :param name_per_pipeline: also send each metric with the pipeline in its name (default:
        when ``[metrics]`` sends plain StatsD, which drops tags).
    """

    def __init__(self, stats: Any = None, *, name_per_pipeline: bool | None = None) -> None:
        self._stats = stats
        self._per_pipeline = name_per_pipeline

    def _backend(self) -> tuple[Any, bool]:
        if self._stats is None:
            from airflow_provider_eo.version_compat import airflow_stats

            self._stats = airflow_stats()
        if self._per_pipeline is None:
            self._per_pipeline = _plain_statsd()
        return self._stats, self._per_pipeline

    def _send(self, method: str, name: str, value: Any, pipeline: str) -> None:
        stats, per_pipeline = self._backend()
        getattr(stats, method)(name, value, tags={"pipeline": pipeline})
        if per_pipeline:
            getattr(stats, method)(per_pipeline_name(name, pipeline), value)

    def count(self, name: str, value: int, *, pipeline: str) -> None:
        """``Stats.incr(name, value, tags={"pipeline": ...})``."""
        self._send("incr", name, value, pipeline)

    def seconds(self, name: str, value: float, *, pipeline: str) -> None:
        """``Stats.timing`` (a StatsD timer carries milliseconds: ``|ms``)."""
        self._send("timing", name, dt.timedelta(seconds=value), pipeline)

    def gauge(self, name: str, value: float, *, pipeline: str) -> None:
        """``Stats.gauge(name, value, tags={"pipeline": ...})``."""
        self._send("gauge", name, value, pipeline)


def pipeline_metrics(pipeline: str) -> PipelineMetrics:
    """The metrics of ``pipeline`` through Airflow's ``Stats``."""
    return PipelineMetrics(AirflowStatsSink(), pipeline)
