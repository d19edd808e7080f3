"""Run a Spark Structured Streaming application whose query writes through
:class:`~airflow_provider_eo.streaming.KafkaExactlyOnceSink`, as one Airflow task.

The task spark-submits the user's application (a ``SparkSubmitOperator``) with the run id
the sink registers its query's run under (``EO_STREAM_RUN_ID``), and the connection settings
the sink names handed to a client-mode driver through the same private file as eo's own
applications. It ends with the run: success (the run ENDED: an ``availableNow`` query that
finished, a stop request) with the run's row in XCom, or :class:`QueryRunFailed` naming the
run's state and error. Marking the task failed or success asks the run to stop cleanly (the
ledger's stop request, as ``eo stream-stop``) before the Spark provider kills spark-submit.

With ``deferrable`` (by default Airflow's ``[operators] default_deferrable``; client deploy
mode) the task starts the application detached, as ``EoStreamOperator(deferrable=True)``
does (:mod:`~airflow_provider_eo.detach`: a launcher in a new session, output in a log file
on the worker), and defers to :class:`~airflow_provider_eo.triggers.stream.EoStreamRunTrigger`,
which watches the query's run in the ledger: the task holds no worker slot while the query
runs. A retry (or a cleared task) whose earlier try's query still runs re-attaches to it
instead of starting a second one (the run ids of one task's tries share a prefix, and the
ledger allows one live run per sink). Marking the deferred task failed or success asks the
run to stop cleanly. It needs a worker host that outlives the task (Local/Celery executors).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import tempfile
import time
from pathlib import Path
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
from airflow_provider_eo.runtime import resolve_pipeline
from airflow_provider_eo.version_compat import (
    AirflowException,
    AirflowFailException,
    Context,
    default_deferrable,
)

__all__ = ["EoQueryOperator", "QueryRunFailed", "query_run_id", "query_run_prefix"]


class QueryRunFailed(AirflowException):
    """The query's application ended without its run ENDED in the ledger."""


def query_run_prefix(dag_id: str, run_id: str, task_id: str) -> str:
    """What the run ids of every try of one query task (a DAG run's task) start with."""
    digest = hashlib.sha256(f"{dag_id}\0{run_id}\0{task_id}".encode()).hexdigest()[:12]
    return f"af-{task_id[:36]}-{digest}-"


def query_run_id(dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
    """The run id of one try of a query task: readable, unique per try, at most 64 characters."""
    return f"{query_run_prefix(dag_id, run_id, task_id)}{try_number}"


class EoQueryOperator(SparkSubmitOperator):
    """Submit a Structured Streaming application that writes through a
    :class:`~airflow_provider_eo.streaming.KafkaExactlyOnceSink` and track its run.

    :param sink: ``"module:ATTR"`` of the sink the application's query uses (imported by the
        task for its name, ledger and connections; the application imports the same one).
    :param application: the application (``.py``) to spark-submit.
    :param stop_timeout: seconds a stopped task waits for the query to stop cleanly before
        spark-submit is killed.
    :param deferrable: client mode: start the application detached and wait in the triggerer
        (no worker slot held; a retry re-attaches to its query). ``None``: Airflow's
        ``[operators] default_deferrable``.
    :param poll_interval: deferrable: seconds between the triggerer's reads of the run.
    :param startup_timeout: deferrable: seconds the query may take to register its run (its
        first batch) before the task fails.
    :param log_dir: deferrable: where the detached application's log goes on the worker
        (default: the temp folder's ``eo-query``).
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
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        startup_timeout: float = 600.0,
        log_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, conn_id=conn_id, deploy_mode=deploy_mode, **kwargs)
        remember_spark_target(self, conn_id, deploy_mode)
        self.sink = sink
        self.stop_timeout = float(stop_timeout)
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.startup_timeout = float(startup_timeout)
        self.log_dir = log_dir
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
        # The connections are read here, by the task: never in Spark conf or the command line.
        resolved = resolve_pipeline(sink.base_pipeline())
        base, settings = resolved.pipeline, (resolved.settings or None)
        self._eo_ledger_url = base.ledger_url
        ti = context["ti"]
        self._eo_run_id = query_run_id(ti.dag_id, ti.run_id, ti.task_id, ti.try_number)
        _master, deploy_mode = spark_target(self)
        if self.deferrable:
            if deploy_mode == "cluster":
                raise AirflowFailException(
                    f"sink {sink.name!r}: deferrable=True starts the application detached in client "
                    "deploy mode; in cluster deploy mode use deferrable=False (the Spark provider "
                    "tracks the driver)"
                )
            live = self._live_run_of_this_task(sink.name, query_run_prefix(ti.dag_id, ti.run_id, ti.task_id))
            if live is not None:
                self.log.info(
                    "sink %s: the query's run %s of an earlier try still runs (%s, pid %s; heartbeat "
                    "%.1fs ago): re-attaching to it instead of starting a second query; its log: %s",
                    sink.name,
                    live.run_id,
                    live.host,
                    live.pid,
                    live.heartbeat_age_s or 0.0,
                    live.log_path,
                )
                self._eo_run_id = live.run_id
                self._defer_on(sink)
        add_task_time_jars(self, sink.name)
        if settings is not None and deploy_mode != "cluster":
            # A client-mode driver gets them through the private, read-once hand-off file
            # (its path in this task's environment, which spark-submit passes on).
            handoff = write_handoff(settings)
            self._eo_handoff = str(handoff)
            os.environ[names.CONNECTIONS_FILE_ENV] = str(handoff)
        self.env_vars = {**(self.env_vars or {}), RUN_ID_ENV: self._eo_run_id}
        self._hook = None  # built afresh with this try's environment
        self.log.info("sink %s: the query's run is %s", sink.name, self._eo_run_id)
        if self.deferrable:
            self._launch_detached(sink)  # defers; never returns
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

    # -- deferrable: a detached application tracked through the ledger -------------------------

    def _live_run_of_this_task(self, name: str, prefix: str) -> Any:
        """The sink's live run when an earlier try of this task started it, else None. A live
        run of anyone else is refused: one query per sink."""
        from airflow_provider_eo.ledger import CheckpointNotFound, Ledger

        assert self._eo_ledger_url is not None
        with Ledger(self._eo_ledger_url) as ledger:  # as the sink opens it: before its first batch too
            try:
                live = ledger.live_stream_run(name)
            except CheckpointNotFound:  # the sink never ran a batch: nothing to re-attach to
                return None
        if live is None:
            return None
        if live.run_id.startswith(prefix):
            return live
        raise AirflowException(
            f"sink {name!r}: a query already runs through it (run {live.run_id} on {live.host}, pid "
            f"{live.pid}); stop it first (`eo stream-stop {self.sink}`) or retry this task later"
        )

    def _launch_detached(self, sink: Any) -> None:
        """spark-submit the application from a detached launcher and defer."""
        from airflow_provider_eo.detach import launch_detached

        assert self._eo_run_id is not None and self._eo_ledger_url is not None
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", sink.name)
        log_dir = Path(self.log_dir) if self.log_dir else Path(tempfile.gettempdir()) / "eo-query"
        log_path = log_dir / f"{safe}-{self._eo_run_id}.log"
        try:
            pid = launch_detached(
                self._get_hook(),
                self.application,
                pipeline=sink.name,
                run_id=self._eo_run_id,
                ledger_url=self._eo_ledger_url,
                log_path=log_path,
            )
        finally:
            # The launcher has the hand-off path in its environment now; the driver deletes the
            # file when it reads it (as for a detached stream).
            os.environ.pop(names.CONNECTIONS_FILE_ENV, None)
        self.log.info(
            "sink %s: the application started detached (run %s, launcher pid %d on this worker); "
            "its log: %s. Waiting in the triggerer (no worker slot held).",
            sink.name,
            self._eo_run_id,
            pid,
            log_path,
        )
        self._defer_on(sink)

    def _defer_on(self, sink: Any) -> None:
        from airflow_provider_eo.triggers.stream import EoStreamRunTrigger

        assert self._eo_run_id is not None

        conn_id = sink.base_pipeline().ledger_conn_id
        ledger_ref: dict[str, Any] = (
            {"ledger_conn_id": conn_id} if conn_id else {"ledger_url": self._eo_ledger_url}
        )
        try:
            trigger = EoStreamRunTrigger(
                pipeline=sink.name,
                run_id=self._eo_run_id,
                poll_interval=self.poll_interval,
                startup_timeout=self.startup_timeout,
                submitted_at=time.time(),
                **ledger_ref,
            )
        except ValueError as exc:  # a ledger URL with a password: it must come by connection
            raise AirflowFailException(str(exc)) from exc
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The detached query's run ended: its row (XCom), or :class:`QueryRunFailed`. The
        run's id comes with the event; the ledger is the sink's, read again here."""
        base = resolve_pipeline(self._load_sink().base_pipeline()).pipeline
        self._eo_run_id, self._eo_ledger_url = str(event["run_id"]), base.ledger_url
        name = (event.get("run") or {}).get("pipeline") or self.sink
        run = self._read_run()
        if event.get("status") == "success" and run is not None and run.state == "ENDED":
            return dict(run.to_json())
        what = str(event.get("reason") or f"the run ended {event.get('status')}")
        raise QueryRunFailed(self._describe(name, run, what))

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
        ``stop_timeout`` for spark-submit to exit, then let the Spark provider kill it. (A
        deferred task is stopped through its trigger: EoStreamRunTrigger asks the run to stop
        when the task is marked failed or success.)"""
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
