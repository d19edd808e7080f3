"""Run a pipeline in streaming mode (docs/design.md §8) as one Airflow task.

The task spark-submits ``airflow_provider_eo/apps/stream.py``, the long-running
application that plans, prepares and (``commit="inline"``) commits a checkpoint every
``interval`` seconds with the ledger as its only offset store.

Where the driver runs, and what holds a worker slot (honest about both modes):

- **client deploy mode** (``local[*]``, standalone client, YARN client), ``deferrable=False``:
  the driver is a child of the task, so the task holds its worker slot for the whole run.
  ``duration``/``checkpoints`` bound the run; SIGTERM (task killed, marked failed/success in
  the UI) reaches spark-submit via the Spark provider's ``on_kill``.
- **client deploy mode, ``deferrable=True``** (by default when Airflow's ``[operators]
  default_deferrable`` is on): the task starts the driver *detached* (a
  launcher in a new session, :mod:`~airflow_provider_eo.detach`; output in a log
  file on the worker) and defers: it holds no worker slot while the stream runs. The
  triggerer watches the run's row in the ledger (:class:`EoStreamRunTrigger`: heartbeat on
  the database's clock, ENDED with the summary, FAILED with the driver's error, LOST when
  the heartbeat goes stale); marking the waiting task failed/success asks the run to stop
  cleanly (ledger stop request, as ``eo stream-stop`` does). A retry finds a run of this
  task still alive and re-attaches to it instead of starting a second driver. Needs a
  worker host that outlives the task (Local/Celery executors; not a Kubernetes-executor pod,
  which is deleted when the task defers).
- **cluster deploy mode** (YARN cluster with ``yarn_track_via_rm_api=True``, Kubernetes
  with ``track_driver_via_k8s_api=True``; Spark refuses cluster deploy mode for Python
  applications on a standalone master): the Spark provider's durable submission tracks the
  driver. On Airflow >= 3.3 a retry (or a cleared task) re-attaches to this pipeline's
  stream driver while it still runs instead of submitting a second one (its id is kept in
  the task's ``task_state_store`` per pipeline); once that driver has ended, whether it
  finished, failed or is unknown to the cluster, the next try submits a new stream, which
  resumes the unfinished checkpoints from the ledger (an ended stream is not taken for this
  try's work). Below Airflow 3.3 every try submits. The task still polls from its worker
  slot. The driver reads the pipeline's connections itself there (Airflow's secrets
  backend or ``AIRFLOW_CONN_*`` on its host): a task never sends secrets in Spark conf.

A driver that dies fails the task with :class:`StreamDriverFailed`: the exit code, the
driver's error (its exception and traceback, which the application appends to a report
file the task reads in client mode: no Spark-provider internals) and the checkpoints it
left unfinished. A task retry submits
the application again, and it resumes those checkpoints from the ledger first
(:func:`~airflow_provider_eo.core.stream.run_stream`, case 1): nothing is skipped or
published twice.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo.core.stream_contract import (
    CommitMode,
    StreamAppArgs,
    StreamArgsError,
    StreamReport,
    check_stream_settings,
)
from airflow_provider_eo.operators import _observe as observe
from airflow_provider_eo.operators._openlineage import OpenLineageMixin
from airflow_provider_eo.operators._resume import resume_key, resume_submission
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    open_ledger,
)
from airflow_provider_eo.operators.submit import (
    configure_submit,
    end_submit,
    provider_application,
    remember_spark_target,
    spark_target,
)
from airflow_provider_eo.triggers.stream import EoStreamRunTrigger
from airflow_provider_eo.version_compat import (
    AirflowException,
    AirflowFailException,
    Context,
    default_deferrable,
)

STREAM_MODULE = "airflow_provider_eo.apps.stream"
STREAM_APP = "eo-stream"
_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


class StreamDriverFailed(AirflowException):
    """The streaming application's driver exited with an error. ``exit_code`` is
    spark-submit's (``None`` when unknown), ``tail`` the driver's error and traceback, and
    ``unfinished`` the checkpoints a retry resumes. Data is not at risk: the retry resumes
    the unfinished checkpoints from the ledger."""

    def __init__(
        self, message: str, *, exit_code: int | None, tail: list[str], unfinished: list[int]
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.tail = tail
        self.unfinished = unfinished


def _optional_float(value: Any) -> float | None:
    return None if value in (None, "", "None") else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value in (None, "", "None") else int(value)


class EoStreamOperator(OpenLineageMixin, PipelineTaskMixin, SparkSubmitOperator):
    """Submit the pipeline's long-running streaming application and track it until it ends.

    A :class:`SparkSubmitOperator` whose application is
    ``airflow_provider_eo/apps/stream.py`` (see the module docstring for where the
    driver runs and the worker slot). The task succeeds when the application exits 0: after
    ``duration`` seconds, after ``checkpoints`` checkpoints, on SIGTERM, or when the
    pipeline is stopped (``eo stop``, a stop-with-savepoint). It fails with
    :class:`StreamDriverFailed` when the driver dies; a retry resumes from the ledger.

    Returns (XCom) the application's summary (``pipeline``, ``commit``, ``checkpoints``,
    ``records``, ``reason``, ``unfinished`` ...).

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param interval: seconds between checkpoints. (templated)
    :param commit: ``"inline"`` (the driver commits each prepared checkpoint) or
        ``"airflow"`` (checkpoints are left PREPARED for a commit DAG). (templated)
    :param duration: optional bound: stop cleanly after this many seconds. (templated)
    :param checkpoints: optional bound: stop cleanly after this many checkpoints (resumed
        ones count). (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's config,
        client mode only. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL, client mode only. (templated)
    :param spark_conn_id: the Spark connection (``spark_default``).
    :param conf: Spark configuration; see :class:`SparkSubmitOperator` for every other
        argument (``jars``, ``env_vars``, ``deploy_mode``, ...).
    :param deferrable: client mode: start the driver detached and wait in the triggerer,
        holding no worker slot (see the module docstring). Default: Airflow's ``[operators]
        default_deferrable``; then in cluster deploy mode the Spark provider tracks the driver
        from the task (an explicit ``True`` is refused there).
    :param heartbeat: seconds between the run's heartbeats in the ledger; a run silent for 4
        heartbeats counts as lost.
    :param poll_interval: deferrable: seconds between the triggerer's reads of the run.
    :param startup_timeout: deferrable: seconds the driver may take to register its run
        (spark-submit, waiting for resources) before the task fails.
    :param log_dir: deferrable: where the detached driver's log goes on the worker (default
        ``<tmp>/eo-stream``); the path is in the task log and the run's row.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        *PIPELINE_TEMPLATE_FIELDS,
        "interval",
        "commit",
        "duration",
        "checkpoints",
    )
    ui_color = "#e8f0fd"

    def __init__(
        self,
        *,
        pipeline: str,
        interval: float | str = 5.0,
        commit: str = "inline",
        duration: float | str | None = None,
        checkpoints: int | str | None = None,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        spark_conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        name: str = STREAM_APP,
        deferrable: bool | None = None,
        heartbeat: float = 5.0,
        poll_interval: float = 5.0,
        startup_timeout: float = 600.0,
        log_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("application", "")
        super().__init__(conn_id=spark_conn_id, conf=conf, name=name, **kwargs)
        remember_spark_target(self, spark_conn_id, kwargs.get("deploy_mode"))
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.interval = interval
        self.commit = commit
        self.duration = duration
        self.checkpoints = checkpoints
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        # Airflow's default asks for deferral where it applies; an explicit True in cluster
        # deploy mode is a mistake the task reports.
        self._deferrable_by_default = deferrable is None
        try:
            check_stream_settings(heartbeat=heartbeat)
        except StreamArgsError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from exc
        self.heartbeat = float(heartbeat)
        self.poll_interval = float(poll_interval)
        self.startup_timeout = float(startup_timeout)
        self.log_dir = log_dir

    def _unfinished(self, pipeline: Any) -> list[int]:
        from airflow_provider_eo.core.stream import unfinished_checkpoints

        try:
            with open_ledger(pipeline) as ledger:
                return [cp.checkpoint_id for cp in unfinished_checkpoints(ledger, pipeline.name)]
        except Exception as exc:  # the failure being reported matters more than this read
            self.log.warning(
                "pipeline %s: cannot read the ledger's unfinished checkpoints: %s", pipeline.name, exc
            )
            return []

    def _app_args(self, pipeline: Any) -> StreamAppArgs:
        """The application's arguments from the rendered fields (validated: a bad value fails
        the task, no retry)."""
        try:
            return StreamAppArgs(
                pipeline=self.pipeline,
                interval=float(self.interval),
                commit=cast(CommitMode, str(self.commit)),
                duration=_optional_float(self.duration),
                checkpoints=_optional_int(self.checkpoints),
                heartbeat=self.heartbeat,
            ).validate()
        except StreamArgsError as exc:
            raise AirflowFailException(f"pipeline {pipeline.name!r}: {exc}") from exc

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        pipeline = self.resolve_pipeline()
        app = self._app_args(pipeline)
        if self.deferrable and self._deferrable_by_default and spark_target(self)[1] == "cluster":
            self.log.info(
                "pipeline %s: cluster deploy mode: the Spark provider tracks the driver from this "
                "worker slot ([operators] default_deferrable applies to client deploy mode)",
                pipeline.name,
            )
        elif self.deferrable:
            self._execute_detached(context, pipeline, app)  # defers; never returns
        # Client mode: the driver runs here and appends its JSON lines (and a failure) to a
        # report file; cluster mode: the driver is elsewhere, the ledger tells what it did.
        report: Path | None = None
        if spark_target(self)[1] != "cluster":
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", pipeline.name)
            report = Path(tempfile.gettempdir()) / f"eo-stream-{safe}-{uuid.uuid4().hex[:8]}.jsonl"
            app = dataclasses.replace(app, report_file=str(report))
        cluster = configure_submit(
            self,
            context,
            application=provider_application(STREAM_MODULE),
            application_args=app.to_argv(),
            pipeline_ref=self.pipeline,
            pipeline_name=pipeline.name,
            overrides=self.pipeline_overrides(pipeline),
            staging_dir=pipeline.staging_dir,
        )
        self.log.info(
            "pipeline %s: streaming application (%s deploy mode, commit=%s) starting; unfinished "
            "checkpoints it resumes first: %s",
            pipeline.name,
            "cluster" if cluster else "client",
            self.commit,
            self._unfinished(pipeline) or "none",
        )
        # One stream driver per pipeline: a running one of this task is re-attached to, an
        # ended one is forgotten and the stream submitted again (see the module docstring).
        resume_submission(
            self,
            context,
            key=resume_key("stream", pipeline.name),
            what=f"pipeline {pipeline.name!r}: the streaming application",
        )
        try:
            SparkSubmitOperator.execute(self, context)
            reported = StreamReport.read(report)
        except (AirflowException, RuntimeError) as exc:
            # spark-submit's failure, or a tracked cluster driver's final state (the Spark
            # provider raises RuntimeError for those).
            match = _EXIT_CODE.search(str(exc))
            exit_code = int(match.group(1)) if match else None
            failure = StreamReport.read(report).failure
            if failure is not None:
                tail = [*failure.traceback, failure.error]
            elif report is not None:
                tail = [
                    "(the driver exited without reporting an error: it was killed, e.g. by a signal "
                    "or the OOM killer, or exited directly; its output is in the task log above)"
                ]
            else:
                tail = ["(cluster mode: the driver's log is with the cluster manager)"]
            unfinished = self._unfinished(pipeline)
            raise StreamDriverFailed(
                f"pipeline {pipeline.name!r}: the streaming application's driver died (exit code "
                f"{exit_code if exit_code is not None else 'unknown'}); unfinished checkpoints "
                f"{unfinished or 'none'} are resumed from the ledger by a retry of this task. "
                "The driver's error:\n" + "\n".join(tail),
                exit_code=exit_code,
                tail=tail,
                unfinished=unfinished,
            ) from exc
        finally:
            end_submit(self)  # the connection hand-off, if the driver never read it
            if report is not None:
                report.unlink(missing_ok=True)
        summary = reported.summary or {}
        unfinished = self._unfinished(pipeline)
        self.log.info(
            "pipeline %s: streaming application ended (%s): %s checkpoint(s), %s record(s); "
            "unfinished now: %s",
            pipeline.name,
            summary.get("reason", "no summary"),
            summary.get("checkpoints"),
            summary.get("records"),
            unfinished or "none",
        )
        self._remember_summary(summary)
        return {"pipeline": pipeline.name, "commit": self.commit, **summary, "unfinished": unfinished}

    def _remember_summary(self, summary: dict[str, Any]) -> None:
        """What the stream finished, for its OpenLineage completion event."""
        self.remember_for_lineage(
            commit=str(self.commit), checkpoints=summary.get("checkpoints"), records=summary.get("records")
        )

    # -- deferrable: a detached driver tracked through the ledger ------------------------------

    def _execute_detached(self, context: Context, pipeline: Any, app: StreamAppArgs) -> None:
        """Start the driver detached (or re-attach to this task's live run) and defer."""
        from airflow_provider_eo.core.stream import new_run_id
        from airflow_provider_eo.detach import launch_detached
        from airflow_provider_eo.version_compat import task_identity

        name = pipeline.name
        if spark_target(self)[1] == "cluster":
            raise AirflowFailException(
                f"pipeline {name!r}: deferrable=True starts the driver detached in client deploy "
                "mode; in cluster deploy mode the Spark provider's durable submission tracks the "
                "driver: use deferrable=False there"
            )
        ident = task_identity(context)
        with open_ledger(pipeline) as ledger:
            ledger.ensure_pipeline(name, pipeline.fingerprint())
            live = ledger.live_stream_run(name)
        if live is not None and live.stop_requested_at is not None:
            # Stopping (the task was cleared or marked while it waited, or `eo stream-stop`):
            # re-attaching would end this try with the old run; wait for it to finish its
            # in-flight checkpoints (seconds), then start a new one.
            self.log.info(
                "pipeline %s: stream run %s is stopping (stop requested by %s); waiting for it to end",
                name,
                live.run_id,
                live.stop_requested_by,
            )
            live = self._wait_for_end(pipeline, live)
        if live is not None:
            if (live.dag_id, live.task_id) != (ident["dag_id"], ident["task_id"]):
                raise AirflowException(
                    f"pipeline {name!r}: its streaming application already runs (run {live.run_id} "
                    f"on {live.host}, pid {live.pid}, started by "
                    f"{f'{live.dag_id}.{live.task_id}' if live.dag_id else 'the command line'}); "
                    f"stop it first (`eo stream-stop {self.pipeline}`) or retry this task later"
                )
            self.log.info(
                "pipeline %s: stream run %s of this task still runs (%s, pid %d; heartbeat %.1fs ago): "
                "re-attaching to it instead of starting a second driver; its log: %s",
                name,
                live.run_id,
                live.host,
                live.pid,
                live.heartbeat_age_s or 0.0,
                live.log_path,
            )
            self._defer_on(pipeline, live.run_id)
        run_id = new_run_id()
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        log_dir = Path(self.log_dir) if self.log_dir else Path(tempfile.gettempdir()) / "eo-stream"
        log_path = log_dir / f"{safe}-{run_id}.log"
        app = dataclasses.replace(app, run_id=run_id, log_path=str(log_path))
        configure_submit(
            self,
            context,
            application=provider_application(STREAM_MODULE),
            application_args=app.to_argv(),
            pipeline_ref=self.pipeline,
            pipeline_name=name,
            overrides=self.pipeline_overrides(pipeline),
            staging_dir=pipeline.staging_dir,
        )
        pid = launch_detached(
            self._get_hook(),
            self.application,
            pipeline=name,
            run_id=run_id,
            ledger_url=pipeline.ledger_url,
            log_path=log_path,
        )
        self.log.info(
            "pipeline %s: streaming application started detached (run %s, launcher pid %d on this "
            "worker, commit=%s); its log: %s. Waiting in the triggerer (no worker slot held).",
            name,
            run_id,
            pid,
            self.commit,
            log_path,
        )
        self._defer_on(pipeline, run_id)

    def _wait_for_end(self, pipeline: Any, live: Any) -> Any:
        """Poll until the stopping run ``live`` ended (None) or ``startup_timeout`` passed
        (the run, still live: the caller then reports it)."""
        deadline = time.monotonic() + self.startup_timeout
        while live is not None and live.stop_requested_at is not None and time.monotonic() < deadline:
            time.sleep(min(self.poll_interval, 2.0))
            with open_ledger(pipeline) as ledger:
                live = ledger.live_stream_run(pipeline.name)
        return live

    def _defer_on(self, pipeline: Any, run_id: str) -> None:
        ledger_conn_id = self.ledger_connection_id()
        ledger_ref: dict[str, Any] = (
            {"ledger_conn_id": ledger_conn_id} if ledger_conn_id else {"ledger_url": pipeline.ledger_url}
        )
        try:
            trigger = EoStreamRunTrigger(
                pipeline=pipeline.name,
                run_id=run_id,
                poll_interval=self.poll_interval,
                startup_timeout=self.startup_timeout,
                submitted_at=time.time(),
                **ledger_ref,
            )
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The detached run ended: its summary (XCom), or :class:`StreamDriverFailed`."""
        pipeline = self.resolve_pipeline()
        run = event.get("run") or {}
        run_id = event.get("run_id")
        unfinished = self._unfinished(pipeline)
        if event.get("status") == "success":
            summary = dict(run.get("summary") or {})
            self.log.info(
                "pipeline %s: stream run %s ended (%s): %s checkpoint(s), %s record(s); unfinished now: %s",
                pipeline.name,
                run_id,
                run.get("reason"),
                summary.get("checkpoints"),
                summary.get("records"),
                unfinished or "none",
            )
            self._remember_summary(summary)
            return {"pipeline": pipeline.name, "commit": self.commit, **summary, "unfinished": unfinished}
        if event.get("status") == "lost":  # its heartbeat went stale: the stream stalled
            observe.stream_lost(context, pipeline, {**run, "run_id": run_id}, str(event.get("reason") or ""))
        error = str(run.get("error") or event.get("reason") or "unknown")
        where = f"run {run_id} on {run.get('host', '?')}, pid {run.get('pid', '?')}"
        raise StreamDriverFailed(
            f"pipeline {pipeline.name!r}: the streaming application's detached driver "
            f"{'was lost' if event.get('status') == 'lost' else 'failed'} ({where}): "
            f"{event.get('reason')}. Unfinished checkpoints {unfinished or 'none'} are resumed from "
            f"the ledger by a retry of this task. The driver's error:\n{error}\nIts log on that "
            f"host: {run.get('log_path') or '(not recorded)'}",
            exit_code=None,
            tail=error.splitlines()[-20:],
            unfinished=unfinished,
        )
