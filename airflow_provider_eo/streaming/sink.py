"""``KafkaExactlyOnceSink``: the two-phase-commit sink of a Structured Streaming query.

Spark's Kafka sink is at-least-once. This one makes each micro-batch a checkpoint of the
provider's ledger, keyed by the query's id and the batch id (docs/design.md §12):

1. the batch's source ranges are read from the query's offset log (Spark wrote them before
   it ran the batch, and re-runs the batch with the same ones);
2. a batch already COMMITTED is skipped; one PREPARED by an earlier run is committed from
   what that run staged (never from the re-run's frame); otherwise the batch is recorded
   PLANNED, its frame staged (Parquet under ``staging_dir``) and recorded PREPARED;
3. the staged output is published in Kafka transactions (stable transactional id per commit
   shard, commit marker, consumer-group offsets of the batch's ends), then COMMITTED;
4. ``foreachBatch`` returns and Spark writes its commit log.

A crash anywhere is finished by the query's restart from the same checkpoint location.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.connections import ConnectionSettings
from airflow_provider_eo.core.batches import BatchPosition, OffsetLog
from airflow_provider_eo.core.coordinator import Coordinator
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.metrics import MetricsSink
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import Actor, Ledger, RangeSpec
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL, redact_url
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.runtime import build_runtime, resolve_pipeline, take_handoff

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["RUN_ID_ENV", "KafkaExactlyOnceSink"]

log = logging.getLogger(__name__)

#: The run id the sink registers its query's run under (an Airflow task that submitted the
#: query sets it to track that run); a fresh one when unset.
RUN_ID_ENV = "EO_STREAM_RUN_ID"


class KafkaExactlyOnceSink:
    """Exactly-once Kafka output for a Structured Streaming query.

    ::

        sink = KafkaExactlyOnceSink(
            name="orders_agg",
            kafka={"bootstrap.servers": "broker:9092"},
            sink_topic="orders_agg",
            ledger_url="postgresql+psycopg://eo@db/eo",
            staging_dir="s3a://bucket/eo-staging",
        )
        query = sink.start(counts, checkpoint_location="s3a://bucket/ckpt/orders_agg")

    The frame has ``value`` and optionally ``key``, ``headers``, ``partition`` (as a
    pipeline transform's output). The query's Kafka sources are the pipeline's source
    topics; the consumer group (default ``eo.<name>``) moves with each committed batch.

    :param name: the pipeline name in the ledger (one query per name).
    :param kafka: librdkafka-style client config of the sink's cluster (``bootstrap.servers``
        at least, unless ``kafka_conn_id`` gives it).
    :param sink_topic: the topic the output is published to, exactly once.
    :param kafka_conn_id: an Airflow ``kafka`` connection merged over ``kafka``.
    :param ledger_url: SQLAlchemy URL of the ledger (default: the embedded SQLite one).
    :param ledger_conn_id: or an Airflow connection naming it.
    :param staging_dir: where each batch's output is staged until it is committed; a folder
        the driver and the executors share (HDFS, S3, GCS, a shared filesystem).
    :param consumer_group: the group whose offsets move with each batch (default ``eo.<name>``).
    :param commit_shards: Kafka transactions per batch (each owns a set of sink partitions).
    :param commit_mode: ``local`` (the driver publishes), ``spark`` (executors publish the
        shards) or ``auto``.
    :param transactional_id_prefix: prefix of the shards' stable transactional ids.
    :param transaction_timeout_ms: ``transaction.timeout.ms`` of the commit producers.
    :param allow_new_query: accept a query with another id (a new checkpoint location) on a
        pipeline another query wrote; its ranges must continue where the old one's ended.
    :param heartbeat_s: the query's run in the ledger beats every this many seconds (as a
        streaming-mode run: one live run per pipeline, a silent one counts as lost, a stop
        request stops the query).
    :param checkpoint_location: the query's checkpoint location, when it is fixed (``start``
        uses it unless given another; ``eo doctor`` and ``eo savepoint create
        --copy-checkpoint-to`` read it).
    :param metrics: where each batch's prepare and commit are reported (the metrics of
        docs/observability.md, as a stream sends them; ``airflow_provider_eo.metrics.
        AirflowStatsSink()`` sends them through Airflow's Stats); None: not reported.
    :param pipeline_options: further :class:`~airflow_provider_eo.pipeline.Pipeline` settings
        (e.g. ``spark_commit_min_records``, ``sink_max_message_bytes``).
    """

    def __init__(
        self,
        name: str,
        kafka: Mapping[str, Any] | None = None,
        *,
        sink_topic: str,
        kafka_conn_id: str | None = None,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        staging_dir: str = ".eo/staging",
        consumer_group: str | None = None,
        commit_shards: int = 1,
        commit_mode: str = "auto",
        transactional_id_prefix: str = "eo",
        transaction_timeout_ms: int = 60_000,
        allow_new_query: bool = False,
        heartbeat_s: float = 5.0,
        checkpoint_location: str | None = None,
        metrics: MetricsSink | None = None,
        **pipeline_options: Any,
    ) -> None:
        for refused in ("source_topics", "transform", "dead_letter_topic", "startup", "backfill_of"):
            if refused in pipeline_options:
                raise ConfigError(
                    f"sink {name!r}: {refused!r} is not a setting of a Structured Streaming sink (the "
                    "query reads its sources and transforms its records itself)"
                )
        self.name = name
        self.metrics = metrics
        self._options: dict[str, Any] = dict(
            name=name,
            kafka=dict(kafka or {}),
            sink_topic=sink_topic,
            ledger_url=ledger_url or DEFAULT_LEDGER_URL,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
            staging_dir=staging_dir,
            consumer_group=consumer_group,
            commit_shards=commit_shards,
            commit_mode=commit_mode,
            transactional_id_prefix=transactional_id_prefix,
            transaction_timeout_ms=transaction_timeout_ms,
            **pipeline_options,
        )
        # Checked now (a bad setting fails before the query starts); the sources are the
        # query's Kafka topics, known at its first batch.
        Pipeline(**self._options, source_topics=(f"{sink_topic}.source",))
        self.allow_new_query = allow_new_query
        self.heartbeat_s = float(heartbeat_s)
        self.checkpoint_location: str | None = checkpoint_location
        self.query: StreamingQuery | None = None
        self._run: _QueryRun | None = None
        # Held while a batch is in foreachBatch: a stop request waits for the batch to end.
        self._in_batch = threading.Lock()
        # Held while the run is ended (by the query's listener or by close()): close() waits
        # for an end the listener began, so the process does not exit before it is written.
        self._ending = threading.Lock()
        self._resolved: Pipeline | None = None
        self._settings: ConnectionSettings | None = None
        self._ledger: Ledger | None = None
        self._listening = False

    @property
    def pipeline(self) -> Pipeline | None:
        """The pipeline the batches are recorded under (None before the first batch: its
        sources are the query's Kafka topics)."""
        return self._resolved

    def as_pipeline(self, source_topics: Sequence[str] | None = None) -> Pipeline:
        """The pipeline the batches are recorded under, as eo's commands take it
        (``eo audit mypkg.sinks:ORDERS_AGG``, ``eo stream-stop ...``): the one of the running
        query, else with the source topics the ledger recorded for its batches.

        :param source_topics: the query's source topics, when they are known but the ledger
            may not hold a batch yet (``eo doctor --acls --source-topic``): the pipeline with
            these, the ledger not read.
        """
        if source_topics:
            return self._resolve(
                dataclasses.replace(self.base_pipeline(), source_topics=tuple(source_topics))
            )
        if self._resolved is not None:
            return self._resolved
        from airflow_provider_eo.core.batches import newest_checkpoint

        pipeline = self._resolve(self.base_pipeline())
        with Ledger(pipeline.ledger_url) as ledger:
            newest = newest_checkpoint(ledger, self.name)
        if newest is None:
            raise ConfigError(
                f"sink {self.name!r}: the ledger at {redact_url(pipeline.ledger_url)} has no batch of "
                "this query yet (start the query first; `eo doctor --acls` takes the query's source "
                "topics as --source-topic)"
            )
        topics = sorted({r.topic for r in newest.ranges})
        return dataclasses.replace(pipeline, source_topics=tuple(topics))

    # -- wiring ------------------------------------------------------------------------------

    def start(
        self,
        df: DataFrame,
        checkpoint_location: str | None = None,
        *,
        trigger_interval: str | None = "5 seconds",
        output_mode: str = "update",
        query_name: str | None = None,
        available_now: bool = False,
    ) -> StreamingQuery:
        """Start ``df``'s query writing through this sink and return Spark's ``StreamingQuery``.

        :param checkpoint_location: the query's checkpoint location (its offset log is what
            the sink records each batch's ranges from; restart the query from the same one);
            default: the sink's ``checkpoint_location``.
        :param trigger_interval: processing-time trigger (``None``: as fast as possible).
        :param output_mode: ``append``, ``update`` or ``complete``, as the query needs.
        :param available_now: process what the sources hold now, in batches, then stop.
        """
        checkpoint_location = checkpoint_location or self.checkpoint_location
        if not checkpoint_location:
            raise ConfigError(
                f"sink {self.name!r}: give the query's checkpoint location (start(df, "
                "checkpoint_location=...) or KafkaExactlyOnceSink(checkpoint_location=...))"
            )
        if self.query is not None and self.query.isActive:
            raise ConfigError(
                f"sink {self.name!r}: query {self.query.id} still writes through this sink; stop it "
                "(query.stop()) before starting another (one query per pipeline name)"
            )
        self._end_run_if_terminated()
        self.checkpoint_location = checkpoint_location
        location = checkpoint_location

        def foreach_batch(frame: DataFrame, batch_id: int) -> None:
            # Bound to this query's location: its offset log and its id are read per batch.
            with self._in_batch:
                self._batch(frame, batch_id, location)

        writer = (
            df.writeStream.foreachBatch(foreach_batch)
            .outputMode(output_mode)
            .option("checkpointLocation", checkpoint_location)
        )
        if query_name:
            writer = writer.queryName(query_name)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger_interval:
            writer = writer.trigger(processingTime=trigger_interval)
        self._listen(df.sparkSession)
        self.query = writer.start()
        return self.query

    def _listen(self, spark: Any) -> None:
        """End the query's run in the ledger when the query terminates (a Spark listener:
        whatever ends it, even when nobody waits for it)."""
        from pyspark.sql.streaming.listener import StreamingQueryListener

        if self._listening:
            return
        self._listening = True
        sink = self

        class _Ended(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                pass

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                if sink.query is not None and str(event.id) == str(sink.query.id):
                    sink._end_run(event.exception)

        spark.streams.addListener(_Ended())

    def close(self) -> None:
        """End the query's run in the ledger when the query has terminated (its listener does
        so too, asynchronously: call this before the process exits), and close the ledger
        connections."""
        self._end_run_if_terminated()
        if self._ledger is not None:
            self._ledger.close()

    def _end_run_if_terminated(self) -> None:
        """End the run of the sink's query in the ledger when that query has terminated
        (returns once it is ended, by this call or by the listener)."""
        query = self.query
        if query is None or query.isActive:
            return
        error = query.exception() if self._run is not None else None
        self._end_run(str(error) if error is not None else None)

    def _end_run(self, error: str | None) -> None:
        """End the query's run once, whoever comes first; the other waits until it is written."""
        with self._ending:
            run, self._run = self._run, None
            if run is not None:
                run.end(error)

    # -- one micro-batch -----------------------------------------------------------------------

    def foreach_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: publish batch ``batch_id``'s output exactly once (see the module)."""
        with self._in_batch:
            self._batch(df, batch_id, self.checkpoint_location)

    def _batch(self, df: DataFrame, batch_id: int, location: str | None) -> None:
        from airflow_provider_eo.spark.frame_stager import FrameStager
        from airflow_provider_eo.spark.offset_log import batch_offsets, query_id

        if location is None:
            raise ConfigError(
                f"sink {self.name!r}: start the query with KafkaExactlyOnceSink.start(df, "
                "checkpoint_location=...) so the sink can read the query's offset log"
            )
        spark = df.sparkSession
        # Read at every batch, never kept: a start from another location (or a location
        # deleted and made again) is another query, with its own id and batch ids from 0.
        current_query = query_id(spark, location)
        where = f"pipeline {self.name!r}, query {current_query}, batch {batch_id}"
        offsets = batch_offsets(spark, location, int(batch_id), where=where)
        if not offsets.ends:
            raise ConfigError(
                f"{where}: the query reads no Kafka source; the sink records a batch by its Kafka ranges"
            )
        pipeline = self._pipeline_for(sorted({t for t, _ in offsets.ends}))
        ranges = self._ranges(pipeline, offsets.starts, offsets.ends)
        ledger = self._ledger_for(pipeline)
        actor = Actor.here()
        if self._run is None:
            ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
            self._run = _QueryRun.begin(ledger, pipeline, self, actor)
        position = BatchPosition(current_query, int(batch_id), ranges)
        coordinator = self._coordinator(pipeline, ledger, actor, spark)

        def commit(checkpoint_id: int) -> None:
            coordinator.commit(checkpoint_id)

        planned = coordinator.plan(OffsetLog(position, self.allow_new_query, commit_previous=commit))
        if planned.step != "prepare":
            # The frame is still run to its end, its output thrown away: a stateful query's
            # state stores commit this batch's version only when every partition ran (Spark
            # refuses the batch otherwise, and the next batch would lack its state).
            df.write.format("noop").mode("overwrite").save()
        if planned.step == "skip":
            log.info("%s: nothing to publish (%s)", where, planned.reason)
            return
        assert planned.checkpoint is not None
        checkpoint_id = planned.checkpoint.checkpoint_id
        if planned.step == "prepare":
            fault_point("batch.before_stage")
            coordinator.prepare(checkpoint_id, FrameStager(df))
        else:
            log.warning("%s: %s; its staged output is published, not this run's", where, planned.reason)
        commit(checkpoint_id)
        fault_point("batch.after_commit")

    # -- helpers -------------------------------------------------------------------------------

    def _pipeline_for(self, topics: list[str]) -> Pipeline:
        """The pipeline with the query's Kafka topics as its sources, connections applied."""
        if self._resolved is None or sorted(self._resolved.source_topics) != topics:
            self._resolved = self._resolve(Pipeline(**self._options, source_topics=tuple(topics)))
        return self._resolved

    def base_pipeline(self) -> Pipeline:
        """The sink's settings as a pipeline whose source is a placeholder (the query's Kafka
        topics are known at its first batch): its name, cluster, ledger and connections."""
        return Pipeline(**self._options, source_topics=(f"{self.name}.source",))

    def _resolve(self, pipeline: Pipeline) -> Pipeline:
        """``pipeline`` with its Airflow connections applied (when it names any): the settings
        an Airflow task handed this driver (client deploy mode: the private hand-off file,
        read once and kept for the pipelines of later batches), else the connections read
        here (:func:`~airflow_provider_eo.runtime.resolve_pipeline`)."""
        handed = take_handoff()
        if handed is not None:
            self._settings = handed
        return resolve_pipeline(pipeline, handoff=self._settings).pipeline

    def _ledger_for(self, pipeline: Pipeline) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(pipeline.ledger_url)
        return self._ledger

    @staticmethod
    def _ranges(
        pipeline: Pipeline, starts: Mapping[tuple[str, int], int | None], ends: Mapping[tuple[str, int], int]
    ) -> tuple[RangeSpec, ...]:
        """The batch's ranges; a partition the query found in this batch starts where Spark
        starts it, at its earliest offset."""
        new = [tp for tp, start in starts.items() if start is None]
        earliest = admin.list_offsets(librdkafka_config(pipeline.kafka), new, spec="earliest") if new else {}
        out = []
        for tp in sorted(ends):
            start = starts.get(tp)
            out.append(RangeSpec(tp[0], tp[1], earliest[tp] if start is None else start, ends[tp]))
        return tuple(out)

    def _coordinator(self, pipeline: Pipeline, ledger: Ledger, actor: Actor, spark: Any) -> Coordinator:
        """The batch's coordinator: its commits run their shards as the pipeline's commit
        mode says (on the query's SparkSession in spark mode), its steps reported to ``metrics``.
        The batch's frame is its stager, so the runtime is built without one."""
        runtime = build_runtime(pipeline, spark=spark, stage=False, metrics=self.metrics)
        return runtime.coordinator(ledger, actor)


class _QueryRun:
    """The query's run in the ledger, as a streaming-mode run: registered at the first batch
    (another live run of the pipeline is refused, a dead one on this host declared LOST),
    beating every ``heartbeat_s``; a stop request (``eo stream-stop``, the Airflow task
    marked failed) stops the query, whose interrupted batch is re-run by its next start."""

    def __init__(self, ledger: Ledger, run_id: str, heart: Any, stop: threading.Event) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.heart = heart
        self.stop = stop

    @classmethod
    def begin(cls, ledger: Ledger, pipeline: Pipeline, sink: KafkaExactlyOnceSink, actor: Actor) -> _QueryRun:
        from airflow_provider_eo.core.stream import RunHeartbeat, new_run_id, register_run

        run = register_run(
            ledger,
            pipeline.name,
            run_id=os.environ.get(RUN_ID_ENV) or new_run_id(),
            commit="inline",
            heartbeat_s=sink.heartbeat_s,
            actor=actor,
        )
        stop = threading.Event()
        heart = RunHeartbeat(ledger, run.run_id, sink.heartbeat_s, stop)
        heart.start()
        this = cls(ledger, run.run_id, heart, stop)
        threading.Thread(target=this._stop_query, args=(sink,), name="eo-query-stop", daemon=True).start()
        log.info("pipeline %r: query run %s registered", pipeline.name, run.run_id)
        return this

    def _stop_query(self, sink: KafkaExactlyOnceSink) -> None:
        self.stop.wait()
        if self.heart.stop_requested_by or self.heart.superseded:
            log.warning("stream run %s: stopping the query (%s)", self.run_id, self.reason())
            with sink._in_batch:  # let a batch in progress finish (a later one is re-run)
                pass
            if sink.query is not None:
                sink.query.stop()

    def reason(self) -> str:
        if self.heart.superseded:
            return "superseded"
        if self.heart.stop_requested_by:
            return f"stop requested by {self.heart.stop_requested_by}"
        return "the query ended"

    def end(self, error: str | None) -> None:
        """ENDED, or FAILED with the query's exception."""
        from airflow_provider_eo.ledger.streams import ENDED, FAILED

        self.heart.finish()
        if error and not self.heart.stop_requested_by:
            self.ledger.end_stream_run(
                self.run_id, state=FAILED, reason=f"the query failed: {str(error)[:500]}", error=str(error)
            )
        else:
            self.ledger.end_stream_run(self.run_id, state=ENDED, reason=self.reason())
        self.stop.set()
