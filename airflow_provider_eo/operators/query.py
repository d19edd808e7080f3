"""Run a Spark Structured Streaming application whose query writes through
:class:`~airflow_provider_eo.streaming.KafkaExactlyOnceSink`, as one Airflow task.

The task spark-submits the user's application (a ``SparkSubmitOperator``) with the run id
the sink registers its query's run under (``EO_STREAM_RUN_ID``), and the connection settings
the sink names handed to a client-mode driver through the same private file as eo's own
applications. It ends with the run: success (the run ENDED: an ``availableNow`` query that
finished, a stop request) with the run's row in XCom, or :class:`QueryRunFailed` naming the
run's state and error. Marking the task failed or success asks the run to stop cleanly (the
ledger's stop request, as ``eo stream-stop``) before the Spark provider kills spark-submit.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo import names
from airflow_provider_eo.connections import write_handoff
from airflow_provider_eo.operators.submit import (
    add_task_time_jars,
    end_submit,
    remember_spark_target,
    spark_target,
)
from airflow_provider_eo.version_compat import AirflowException, AirflowFailException, Context

__all__ = ["EoQueryOperator", "QueryRunFailed", "query_run_id"]


class QueryRunFailed(AirflowException):
    """The query's application ended without its run ENDED in the ledger."""


def query_run_id(dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
    """The run id of one try of a query task: readable, unique per try, at most 64 characters."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}".encode()).hexdigest()[:12]
    return f"af-{task_id[:36]}-{digest}-{try_number}"


class EoQueryOperator(SparkSubmitOperator):
    """Submit a Structured Streaming application that writes through a
    :class:`~airflow_provider_eo.streaming.KafkaExactlyOnceSink` and track its run.

    :param sink: ``"module:ATTR"`` of the sink the application's query uses (imported by the
        task for its name, ledger and connections; the application imports the same one).
    :param application: the application (``.py``) to spark-submit.
    :param stop_timeout: seconds a stopped task waits for the query to stop cleanly before
        spark-submit is killed.
    :param kwargs: everything :class:`SparkSubmitOperator` takes (``conn_id``,
        ``application_args``, ``packages``, ``conf``, ...). The Spark Kafka connector jars eo
        installed (``eo setup jars``) are added unless ``packages``/``jars`` name one.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "sink")

    def __init__(
        self,
        *,
        sink: str,
        application: str,
        stop_timeout: float = 120.0,
        conn_id: str = "spark_default",
        deploy_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, conn_id=conn_id, deploy_mode=deploy_mode, **kwargs)
        remember_spark_target(self, conn_id, deploy_mode)
        self.sink = sink
        self.stop_timeout = float(stop_timeout)
        self._eo_run_id: str | None = None
        self._eo_ledger_url: str | None = None

    def _load_sink(self) -> Any:
        from airflow_provider_eo.streaming import KafkaExactlyOnceSink

        module_name, _, attr = self.sink.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise AirflowFailException(f"sink {self.sink!r}: cannot import it ({exc})") from exc
        if not isinstance(obj, KafkaExactlyOnceSink):
            raise AirflowFailException(f"{self.sink!r} is a {type(obj).__name__}, not a KafkaExactlyOnceSink")
        return obj

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from airflow_provider_eo.streaming.sink import RUN_ID_ENV

        sink = self._load_sink()
        base = sink.base_pipeline()
        settings = None
        if base.connection_ids:  # read here, by the task: never in Spark conf or the command line
            from airflow_provider_eo.hooks.base import resolve_connections

            base, settings = resolve_connections(base)
        self._eo_ledger_url = base.ledger_url
        ti = context["ti"]
        self._eo_run_id = query_run_id(ti.dag_id, ti.run_id, ti.task_id, ti.try_number)
        add_task_time_jars(self, sink.name)
        _master, deploy_mode = spark_target(self)
        if settings is not None and deploy_mode != "cluster":
            # A client-mode driver gets them through the private, read-once hand-off file
            # (its path in this task's environment, which spark-submit passes on).
            handoff = write_handoff(settings)
            self._eo_handoff = str(handoff)
            os.environ[names.CONNECTIONS_FILE_ENV] = str(handoff)
        self.env_vars = {**(self.env_vars or {}), RUN_ID_ENV: self._eo_run_id}
        self._hook = None  # built afresh with this try's environment
        self.log.info("sink %s: the query's run is %s", sink.name, self._eo_run_id)
        try:
            super().execute(context)
        except Exception as exc:
            run = self._read_run()
            raise QueryRunFailed(self._describe(sink.name, run, f"the application failed ({exc})")) from exc
        finally:
            end_submit(self)
        run = self._read_run()
        if run is None or run.state != "ENDED":
            raise QueryRunFailed(self._describe(sink.name, run, "the application exited"))
        return dict(run.to_json())

    def _read_run(self) -> Any:
        from airflow_provider_eo.ledger import Ledger
        from airflow_provider_eo.ledger.streams import StreamRunNotFound

        if self._eo_ledger_url is None or self._eo_run_id is None:
            return None
        with Ledger(self._eo_ledger_url, create=False) as ledger:
            try:
                return ledger.get_stream_run(self._eo_run_id)
            except StreamRunNotFound:
                return None

    def _describe(self, name: str, run: Any, what: str) -> str:
        if run is None:
            return (
                f"sink {name!r}: {what} and its query never registered run {self._eo_run_id} (it ran no "
                "batch through the sink: does the application start its query with this sink?)"
            )
        error = f"\n{run.error[-3000:]}" if run.error else ""
        return f"sink {name!r}: {what}; the query's run {run.run_id} is {run.state}: {run.reason}{error}"

    def on_kill(self) -> None:
        """Ask the query's run to stop (it stops after its batch in progress), wait up to
        ``stop_timeout`` for spark-submit to exit, then let the Spark provider kill it."""
        if self._eo_run_id is not None and self._eo_ledger_url is not None:
            from airflow_provider_eo.ledger import Ledger

            try:
                with Ledger(self._eo_ledger_url, create=False) as ledger:
                    pipelines = [run.pipeline for run in [self._read_run()] if run is not None]
                    for pipeline in pipelines:
                        ledger.request_stream_stop(
                            pipeline, requested_by="airflow: the task was stopped", run_id=self._eo_run_id
                        )
            except Exception as exc:
                self.log.warning("could not ask run %s to stop: %s", self._eo_run_id, exc)
            process = getattr(self._hook, "_submit_sp", None)
            deadline = time.monotonic() + self.stop_timeout
            while process is not None and process.poll() is None and time.monotonic() < deadline:
                time.sleep(1)
        super().on_kill()
