"""Backfill a time interval of a pipeline from Airflow, exactly once, into a backfill sink."""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import time
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo import names
from airflow_provider_eo.apps.args import PrepareAppArgs
from airflow_provider_eo.assets import checkpoint_extra, emit, topic_outlets
from airflow_provider_eo.connections import ConnectionSettings
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, Ledger, LedgerError
from airflow_provider_eo.operators._openlineage import OpenLineageMixin
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.operators.savepoint import parse_bool
from airflow_provider_eo.operators.submit import (
    PrepareNotRecorded,
    configure_submit,
    prepare_application,
    remember_spark_target,
    spark_target,
    submit_prepare,
)
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.version_compat import AirflowFailException, Context, default_deferrable

if TYPE_CHECKING:
    from airflow_provider_eo.core.backfill import BackfillResult

#: Templates of the interval's ends: the DAG run's own data interval.
DATA_INTERVAL_START = "{{ data_interval_start }}"
DATA_INTERVAL_END = "{{ data_interval_end }}"


def to_epoch_ms(value: Any, *, field: str) -> int:
    """An instant as epoch milliseconds: a datetime, an ISO-8601 string (what
    ``{{ data_interval_start }}`` renders; a naive value is taken as UTC) or an integer
    number of milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"{field} must be an ISO-8601 instant or epoch milliseconds, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        moment = value
    else:
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{field} must be an ISO-8601 instant (e.g. 2025-01-01T00:00:00+00:00) or epoch "
                f"milliseconds, got {value!r}"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


class EoBackfillOperator(OpenLineageMixin, PipelineTaskMixin, SparkSubmitOperator):
    """Re-process ``[start, end)`` of a pipeline into a backfill sink topic, exactly once.

    Runs :func:`airflow_provider_eo.core.backfill.run_backfill` over the whole interval:
    the source records whose Kafka timestamp is in ``[start, end)`` and that lie in ranges
    the ledger recorded as COMMITTED, with the pipeline's transform (or ``transform``),
    into ``sink_topic``. The backfill is a pipeline of its own (own name, consumer group
    and commit identity per (pipeline, sink topic)) checkpointed through the same
    protocol: each of its checkpoints is **prepared by spark-submit** of the provider's
    prepare application (the same submission as
    :class:`~airflow_provider_eo.operators.submit.EoSubmitOperator`, with
    ``--backfill-sink-topic``/``--backfill-transform``), then waited for in the ledger
    until PREPARED, then **committed** in Kafka transactions.

    Exactly once across retries and re-runs: a retry (or a cleared task) resumes the
    backfill's unfinished checkpoint; running an interval that is already done adds
    nothing, and adjacent intervals never overlap.

    In client deploy mode the task runs each driver; in cluster mode the Spark provider
    tracks each driver until it ends (see :class:`~airflow_provider_eo.operators.submit.EoSubmitOperator`).

    Retries in cluster deploy mode (Airflow >= 3.3, the Spark provider's ``durable``
    submission): the id of each checkpoint's prepare driver is kept in the task's
    ``task_state_store`` under a key of its own (the backfill pipeline and the checkpoint),
    so the prepares one try submits in turn never take each other's drivers for their own.
    A retry resumes the unfinished checkpoint and re-attaches to that checkpoint's driver
    while it still runs; once the driver has ended, in whatever state, the ledger decides:
    PREPARED is done, anything else is prepared again by a new driver. Client deploy mode,
    and Airflow < 3.3, submit each prepare anew.

    Asset event: with an outlet naming ``sink_topic`` (``outlets=[kafka_asset(bootstrap,
    topic)]``, see :mod:`airflow_provider_eo.assets`), the task's success emits one event for
    the whole interval (Airflow emits one event per outlet per task): its ``extra`` has
    ``pipeline``, ``backfill_pipeline``, ``sink_topic``, ``start``, ``end``,
    ``checkpoint_ids``, ``records`` and ``checkpoints``, one
    :func:`~airflow_provider_eo.assets.checkpoint_extra` per COMMITTED checkpoint of the
    interval, including those an earlier try or run of the same interval committed
    (``already_committed`` true), so a retry after a crash loses none.

    Returns (XCom) ``{"pipeline", "backfill_pipeline", "checkpoints", "records", "start",
    "end", "sink_topic"}``.

    :param pipeline: import path ``"module:ATTR"`` of the live pipeline. (templated)
    :param start: start of the interval (inclusive): ISO-8601 or epoch ms; default the
        run's ``data_interval_start``. (templated)
    :param end: end of the interval (exclusive); default the run's ``data_interval_end``.
        (templated)
    :param sink_topic: the backfill sink topic. (templated)
    :param transform: ``"module:function"`` replacing the pipeline's transform. (templated)
    :param allow_live_sink: allow ``sink_topic`` to be the live pipeline's sink. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's config
        (client mode only). (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL (client mode only). (templated)
    :param conn_id: the Spark connection (``spark_default``); see
        :class:`SparkSubmitOperator` for every other argument (``conf``, ``jars``,
        ``env_vars``, ``deploy_mode``, ...).
    :param deferrable: client deploy mode: start each prepare detached and wait in the
        triggerer (no worker slot held while Spark prepares). ``None``: Airflow's
        ``[operators] default_deferrable``.
    :param poll_interval: deferrable: seconds between the triggerer's reads of the ledger.
    :param prepare_timeout: deferrable: seconds one checkpoint's prepare may take before the
        task fails (a retry resumes the checkpoint).
    :param log_dir: deferrable: where each detached prepare's log goes on the worker (default:
        the temp folder's ``eo-prepare``); the path is in the task log.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        *PIPELINE_TEMPLATE_FIELDS,
        "start",
        "end",
        "sink_topic",
        "transform",
        "allow_live_sink",
    )
    ui_color = "#e8fdf8"

    def __init__(
        self,
        *,
        pipeline: str,
        sink_topic: str,
        start: str | int | dt.datetime = DATA_INTERVAL_START,
        end: str | int | dt.datetime = DATA_INTERVAL_END,
        transform: str | None = None,
        allow_live_sink: bool | str = False,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        conn_id: str = "spark_default",
        name: str = names.PREPARE_APP,
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        prepare_timeout: float = 3600.0,
        log_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("application", "")
        super().__init__(conn_id=conn_id, name=name, **kwargs)
        remember_spark_target(self, conn_id, kwargs.get("deploy_mode"))
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.start = start
        self.end = end
        self.sink_topic = sink_topic
        self.transform = transform
        self.allow_live_sink = allow_live_sink
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.prepare_timeout = float(prepare_timeout)
        self.log_dir = log_dir

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        return self._run(context, earlier=[], earlier_records=0)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """A detached prepare ended (the checkpoint is PREPARED, or it failed or timed out):
        commit it and go on with the interval, deferring again on the next prepare. The
        checkpoints this task committed before it deferred come back in the event (``echo``)."""
        echo = event.get("echo") or {}
        if event.get("status") != "success":
            raise PrepareNotRecorded(
                f"task {self.task_id!r}: backfill {event.get('pipeline')!r}, checkpoint "
                f"{event.get('checkpoint_id')} is {event.get('state')}: {event.get('reason')}. Retry "
                "this task: the retry resumes this checkpoint"
            )
        return self._run(
            context,
            earlier=[int(c) for c in echo.get("checkpoints") or ()],
            earlier_records=int(echo.get("records") or 0),
        )

    def _run(self, context: Context, *, earlier: list[int], earlier_records: int) -> dict[str, Any]:
        """Run the backfill to its end, or until a prepare defers; ``earlier``: the checkpoints
        (and their ``earlier_records``) this task committed before it last deferred."""
        start_ms = to_epoch_ms(self.start, field="start")
        end_ms = to_epoch_ms(self.end, field="end")
        sink_topic = str(self.sink_topic or "").strip()
        if not sink_topic:
            raise AirflowFailException(f"task {self.task_id!r}: sink_topic must name the backfill sink topic")
        transform = str(self.transform).strip() if self.transform not in (None, "", "None") else None
        allow_live_sink = parse_bool(self.allow_live_sink, field="allow_live_sink")
        live = self.resolve_pipeline()
        overrides = self.pipeline_overrides(live)
        extra_args = ["--backfill-sink-topic", sink_topic]
        if transform:
            extra_args += ["--backfill-transform", transform]

        detached = self.deferrable and spark_target(self)[1] != "cluster"
        committed: list[int] = list(earlier)
        records = [earlier_records]

        def prepare(backfill: Pipeline, ledger: Ledger, checkpoint_id: int) -> None:
            if detached:  # defers (raises TaskDeferred) unless the checkpoint is already prepared
                self._prepare_detached(
                    context,
                    backfill,
                    ledger,
                    checkpoint_id,
                    extra_args=extra_args,
                    overrides=overrides,
                    echo={"checkpoints": committed, "records": records[0]},
                )
                return
            self._prepare(
                context, backfill, ledger, checkpoint_id, extra_args=extra_args, overrides=overrides
            )

        def progress(cp: CheckpointRecord) -> None:
            committed.append(cp.checkpoint_id)
            records[0] += cp.records or 0
            self.log.info(
                "backfill of %s: checkpoint %s committed (%s records)",
                live.name,
                cp.checkpoint_id,
                cp.records,
            )

        if self.deferrable and not detached:
            self.log.info(
                "backfill of %s: cluster deploy mode: the Spark provider tracks each prepare driver "
                "from this worker slot (deferrable applies to client deploy mode)",
                live.name,
            )

        # Imported here, not with the module: DAG files import operators, and parsing stays light.
        from airflow_provider_eo.core.backfill import BackfillRequest, run_backfill
        from airflow_provider_eo.metrics import AirflowStatsSink

        with open_ledger(live) as ledger:
            result = run_backfill(
                BackfillRequest(live, start_ms, end_ms, sink_topic, transform, allow_live_sink),
                ledger,
                actor=actor_for(context),
                prepare=prepare,
                progress=progress,
                # No Spark in this worker: a spark-mode pipeline's backfill commits here, and
                # the task log says so (the same markers and ledger rows as a Spark commit).
                say=self.log.warning,
                # Each commit's metrics through Airflow's Stats (the prepare driver sends its own).
                metrics=AirflowStatsSink(),
            )
        summary: dict[str, Any] = result.summary()
        out = {
            "pipeline": summary.get("pipeline", live.name),
            "backfill_pipeline": summary.get("backfill_pipeline"),
            "checkpoints": [*earlier, *(summary.get("checkpoints") or [])],
            "records": earlier_records + int(summary.get("records") or 0),
            "start": dt.datetime.fromtimestamp(start_ms / 1000, dt.timezone.utc).isoformat(),
            "end": dt.datetime.fromtimestamp(end_ms / 1000, dt.timezone.utc).isoformat(),
            "sink_topic": sink_topic,
        }
        self.log.info("pipeline %s: backfill done: %s", live.name, out)
        self.remember_for_lineage(
            backfillPipeline=out["backfill_pipeline"],
            checkpointIds=out["checkpoints"],
            checkpoints=len(out["checkpoints"] or []),
            records=out["records"],
            start=out["start"],
            end=out["end"],
        )
        self._emit_asset_event(
            context,
            live,
            result,
            this_task=set(out["checkpoints"]),
            sink_topic=sink_topic,
            start_ms=start_ms,
            end_ms=end_ms,
        )
        return out

    def lineage_sink_topic(self, pipeline: Pipeline) -> str | None:
        """The backfill's target topic (its OpenLineage output)."""
        return str(self.sink_topic or "").strip() or None

    def _emit_asset_event(
        self,
        context: Context,
        live: Pipeline,
        result: BackfillResult,
        *,
        sink_topic: str,
        start_ms: int,
        end_ms: int,
        this_task: Collection[int] = (),
    ) -> None:
        """Give the target topic's asset event (an outlet naming ``sink_topic``) the whole
        interval's COMMITTED checkpoints: those this try committed (``this_task``, across its
        deferrals) and those an earlier try or run of the same interval did (the ledger's
        checkpoints of the backfill pipeline with this interval as their time filter)."""
        sinks = topic_outlets(self.outlets, sink_topic)
        if not sinks:
            return
        found = {cp.checkpoint_id: cp for cp in result.checkpoints}
        with open_ledger(live) as ledger:
            try:
                listed = ledger.list_checkpoints(result.backfill_pipeline)
            except LedgerError:  # nothing was ever planned for this target
                listed = []
        for cp in listed:
            if cp.state is CheckpointState.COMMITTED and (
                cp.time_filter == (start_ms, end_ms) or cp.checkpoint_id in this_task
            ):
                found.setdefault(cp.checkpoint_id, cp)
        this_try = set(this_task) | {cp.checkpoint_id for cp in result.checkpoints}
        checkpoints = [
            checkpoint_extra(live, cp, sink_topic=sink_topic, already_committed=cid not in this_try)
            for cid, cp in sorted(found.items())
        ]
        extra = {
            "pipeline": live.name,
            "backfill_pipeline": result.backfill_pipeline,
            "sink_topic": sink_topic,
            "start": dt.datetime.fromtimestamp(start_ms / 1000, dt.timezone.utc).isoformat(),
            "end": dt.datetime.fromtimestamp(end_ms / 1000, dt.timezone.utc).isoformat(),
            "checkpoint_ids": sorted(found),
            "records": sum(c["records"] or 0 for c in checkpoints),
            "checkpoints": checkpoints,
        }
        emit(context, sinks, extra)
        self.log.info(
            "backfill %s: %d checkpoint(s) of [%s, %s) announced on %s",
            result.backfill_pipeline,
            len(checkpoints),
            extra["start"],
            extra["end"],
            ", ".join(a.uri for a in sinks),
        )

    def _prepare(
        self,
        context: Context,
        backfill: Pipeline,
        ledger: Ledger,
        checkpoint_id: int,
        *,
        extra_args: Sequence[str],
        overrides: ConnectionSettings | None,
    ) -> None:
        """Prepare one backfill checkpoint with spark-submit; return once it is PREPARED."""
        cp = ledger.get(backfill.name, checkpoint_id)
        if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            self.log.info(
                "backfill %s: checkpoint %s is already %s", backfill.name, checkpoint_id, cp.state.value
            )
            return
        submit_prepare(
            self,
            context,
            pipeline_ref=self.pipeline,
            pipeline_name=backfill.name,
            checkpoint_id=checkpoint_id,
            overrides=overrides,
            extra_args=extra_args,
            ship=[backfill.transform],
            staging_dir=backfill.staging_dir,
        )
        state = ledger.get(backfill.name, checkpoint_id).state
        if state not in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            raise PrepareNotRecorded(
                f"backfill {backfill.name!r}: the prepare job finished but checkpoint "
                f"{checkpoint_id} is {state.value}; see the driver log, then retry this task "
                "(the retry resumes this checkpoint)"
            )

    def _prepare_detached(
        self,
        context: Context,
        backfill: Pipeline,
        ledger: Ledger,
        checkpoint_id: int,
        *,
        extra_args: Sequence[str],
        overrides: ConnectionSettings | None,
        echo: dict[str, Any],
    ) -> None:
        """Start one backfill checkpoint's prepare detached and defer until it is PREPARED
        (returns at once when it already is)."""
        from airflow_provider_eo.detach import launch_detached
        from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger

        cp = ledger.get(backfill.name, checkpoint_id)
        if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            return
        ledger_conn_id = self.ledger_connection_id()
        ledger_ref: dict[str, Any] = (
            {"ledger_conn_id": ledger_conn_id} if ledger_conn_id else {"ledger_url": backfill.ledger_url}
        )
        launch_id = f"prepare-{checkpoint_id}-{uuid.uuid4().hex[:12]}"
        try:  # checked before anything starts: a ledger URL with a password must come by connection
            trigger = EoCheckpointTrigger(
                pipeline=backfill.name,
                checkpoint_id=checkpoint_id,
                poll_interval=self.poll_interval,
                deadline=time.time() + self.prepare_timeout,
                wait_for="prepared",
                echo=echo,
                launch_id=launch_id,
                **ledger_ref,
            )
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from exc
        configure_submit(
            self,
            context,
            application=prepare_application(),
            application_args=[*PrepareAppArgs(self.pipeline, checkpoint_id).to_argv(), *extra_args],
            pipeline_ref=self.pipeline,
            pipeline_name=backfill.name,
            overrides=overrides,
            ship=[backfill.transform],
            staging_dir=backfill.staging_dir,
        )
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", backfill.name)
        log_dir = Path(self.log_dir) if self.log_dir else Path(tempfile.gettempdir()) / "eo-prepare"
        log_path = log_dir / f"{safe}-{launch_id}.log"
        try:
            pid = launch_detached(
                self._get_hook(),
                self.application,
                pipeline=backfill.name,
                run_id=launch_id,
                ledger_url=backfill.ledger_url,
                log_path=log_path,
                prepare_checkpoint=checkpoint_id,
            )
        finally:
            # The launcher inherited the hand-off path (the driver deletes the file when it
            # reads it); this process forgets it, as a resumed task in the same process
            # (dag.test()) must not hand it to its next submit.
            os.environ.pop(names.CONNECTIONS_FILE_ENV, None)
            for key in getattr(self, "_eo_aws_env", None) or ():
                os.environ.pop(key, None)
            self._eo_handoff = None
            self._eo_aws_env: list[str] = []
        self.log.info(
            "backfill %s: the prepare of checkpoint %s started detached (launch %s, launcher pid %d "
            "on this worker); its log: %s. Waiting in the triggerer (no worker slot held).",
            backfill.name,
            checkpoint_id,
            launch_id,
            pid,
            log_path,
        )
        self.defer(trigger=trigger, method_name="execute_complete")
