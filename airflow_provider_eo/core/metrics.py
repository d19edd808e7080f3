"""The metrics a pipeline reports, through a sink its caller plugs in.

The protocol knows which numbers matter and when (a checkpoint committed, prepared,
aborted); it does not know where they go. A caller passes a :class:`MetricsSink`: the
Airflow tasks and the Spark drivers they start use Airflow's ``Stats``
(:mod:`airflow_provider_eo.metrics`), tests a list, the CLI none.

Reporting never changes the outcome of a step: :class:`PipelineMetrics` logs a sink's
failure and goes on (a commit whose metric could not be sent is still committed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_eo.ledger import CheckpointRecord

if TYPE_CHECKING:
    from airflow_provider_eo.core.kafka_clients import KafkaClients

log = logging.getLogger(__name__)

#: Counter: output records of each checkpoint committed (once per checkpoint).
CHECKPOINT_RECORDS = "eo.checkpoint.records"
#: Timer: how long a prepare took (read, transform, stage).
PREPARE_SECONDS = "eo.prepare.seconds"
#: Timer: how long a commit took (every shard published, the ledger updated).
COMMIT_SECONDS = "eo.commit.seconds"
#: Gauge: source records not yet committed (log end minus the committed end).
LAG_RECORDS = "eo.lag.records"
#: Counter: checkpoints aborted (their range is replanned).
CHECKPOINT_ABORTED = "eo.checkpoint.aborted"
#: Counter: source records a committed checkpoint sent to the dead-letter topic.
DEAD_LETTERS = "eo.dead_letters"

#: Every metric name, in the order docs/observability.md's table lists them.
METRIC_NAMES = (
    CHECKPOINT_RECORDS,
    PREPARE_SECONDS,
    COMMIT_SECONDS,
    LAG_RECORDS,
    CHECKPOINT_ABORTED,
    DEAD_LETTERS,
)


class MetricsSink(Protocol):
    """Where metrics go. ``pipeline`` is the pipeline's name (a tag, or part of the name
    where the backend has no tags). A sink may raise: :class:`PipelineMetrics` absorbs it."""

    def count(self, name: str, value: int, *, pipeline: str) -> None:
        """Add ``value`` to the counter ``name``."""
        ...

    def seconds(self, name: str, value: float, *, pipeline: str) -> None:
        """Record one duration of ``value`` seconds on the timer ``name``."""
        ...

    def gauge(self, name: str, value: float, *, pipeline: str) -> None:
        """Set the gauge ``name`` to ``value``."""
        ...


class PipelineMetrics:
    """One pipeline's metrics, sent to ``sink`` (``None``: nowhere). Each method reports one
    protocol moment; none raises."""

    def __init__(self, sink: MetricsSink | None, pipeline: str) -> None:
        self.sink = sink
        self.pipeline = pipeline

    def _send(self, kind: str, name: str, value: float) -> None:
        if self.sink is None:
            return
        try:
            getattr(self.sink, kind)(name, value, pipeline=self.pipeline)
        except Exception as exc:  # a metric is never worth a failed step
            log.warning(
                "pipeline %s: metric %s not sent: %s: %s", self.pipeline, name, type(exc).__name__, exc
            )

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        """``cp`` was just made COMMITTED (by this caller: a repeated commit reports nothing)
        in ``seconds`` (``None``: not measured)."""
        self._send("count", CHECKPOINT_RECORDS, int(cp.records or 0))
        self._send("count", DEAD_LETTERS, int(cp.dead_letters or 0))
        if seconds is not None:
            self._send("seconds", COMMIT_SECONDS, seconds)

    def prepared(self, seconds: float) -> None:
        """A checkpoint was just prepared (staged and PREPARED) in ``seconds``."""
        self._send("seconds", PREPARE_SECONDS, seconds)

    def aborted(self) -> None:
        """A checkpoint was just aborted."""
        self._send("count", CHECKPOINT_ABORTED, 1)

    def lag(self, records: int) -> None:
        """Source records not committed yet, as last measured."""
        self._send("gauge", LAG_RECORDS, records)

    def lag_after(
        self, kafka: Mapping[str, Any], cp: CheckpointRecord, clients: KafkaClients | None = None
    ) -> None:
        """Measure and send the lag left after committing ``cp`` (:func:`source_lag` over the
        partitions it read, through ``clients``); nothing is measured without a sink, a
        failure is logged."""
        if self.sink is None:
            return
        try:
            ends = {(r.topic, r.partition): r.end for r in cp.ranges}
            records = source_lag(kafka, ends, clients=clients)
        except Exception as exc:
            log.warning("pipeline %s: lag not measured: %s: %s", self.pipeline, type(exc).__name__, exc)
            return
        self.lag(records)


def source_lag(
    kafka: Mapping[str, Any],
    ends: Mapping[tuple[str, int], int],
    *,
    timeout_s: float = 5.0,
    clients: KafkaClients | None = None,
) -> int:
    """Source records beyond ``ends`` (``{(topic, partition): committed end}``): the log end
    (last stable offset) minus the committed end, summed over those partitions. One bounded
    Kafka call through ``clients`` (default: the real cluster); raises when Kafka does not
    answer."""
    # Imported here: this module is imported when DAG files are parsed (kept light).
    from airflow_provider_eo.core.kafka_clients import kafka_clients

    log_ends = kafka_clients(kafka, clients).list_offsets(list(ends), spec="latest", timeout_s=timeout_s)
    return sum(max(0, log_ends[tp] - end) for tp, end in ends.items() if tp in log_ends)


class RecordingSink:
    """A sink that keeps what it was sent: ``(kind, name, value, pipeline)`` tuples (tests,
    ``eo`` commands that print what they would report)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, str]] = []

    def count(self, name: str, value: int, *, pipeline: str) -> None:
        self.sent.append(("count", name, value, pipeline))

    def seconds(self, name: str, value: float, *, pipeline: str) -> None:
        self.sent.append(("seconds", name, value, pipeline))

    def gauge(self, name: str, value: float, *, pipeline: str) -> None:
        self.sent.append(("gauge", name, value, pipeline))
