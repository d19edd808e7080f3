"""Commit a PREPARED checkpoint from Airflow: publish its staged output exactly once,
from the Airflow worker (``commit_mode="local"``) or from Spark executors through
``spark-submit`` (``commit_mode="spark"``)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo import names
from airflow_provider_eo.apps.args import CommitAppArgs
from airflow_provider_eo.assets import checkpoint_extra, emit, topic_of, topic_outlets
from airflow_provider_eo.errors import NotPrepared
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState
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
from airflow_provider_eo.pipeline import COMMIT_MODES, Pipeline
from airflow_provider_eo.ui.links import LINK_ATTR, EoCheckpointLink
from airflow_provider_eo.version_compat import AirflowException, Context

if TYPE_CHECKING:
    from airflow_provider_eo.core.coordinator import Coordinator

COMMIT_MODULE = "airflow_provider_eo.apps.commit"


class CommitNotRecorded(AirflowException):
    """The commit job ended but the ledger does not show the checkpoint COMMITTED."""


def commit_application() -> str:
    """File path of the PySpark application ``airflow_provider_eo/apps/commit.py``."""
    return provider_application(COMMIT_MODULE)


def choose_commit_mode(
    requested: str, *, records: int, min_records: int, master: Callable[[], str | None]
) -> Literal["local", "spark"]:
    """Where the operator commits: ``local`` and ``spark`` as given; ``auto`` is ``spark``
    when the Spark connection's master is a cluster and the checkpoint is large enough to
    pay for starting a Spark application (``NEW_APPLICATION_FACTOR`` x ``min_records``,
    :func:`~airflow_provider_eo.core.commit.resolve_commit_mode`), else ``local``.

    ``master`` is called only when the answer depends on it (a small checkpoint never looks
    the connection up); it returns ``None`` when there is no Spark connection, and ``auto``
    then commits locally.
    """
    # Imported here, not with the module: DAG files import operators, and parsing stays light.
    from airflow_provider_eo.core.commit import resolve_commit_mode

    if requested not in COMMIT_MODES:
        raise ValueError(f"commit_mode {requested!r} is not one of {', '.join(COMMIT_MODES)}")
    if requested != "auto":
        return resolve_commit_mode(requested, master="local", records=records, min_records=min_records)
    if records < min_records:
        return "local"
    found = master()
    if found is None:
        return "local"
    # A spark-mode commit here is a new Spark application: its start is paid first.
    return resolve_commit_mode(
        "auto", master=found, records=records, min_records=min_records, session_running=False
    )


class EoCommitOperator(OpenLineageMixin, PipelineTaskMixin, SparkSubmitOperator):
    """Publish a PREPARED checkpoint in Kafka transactions and mark it COMMITTED.

    Idempotent: committing a COMMITTED checkpoint does nothing (and submits nothing), and a
    retry after any crash (even between the Kafka commit and the ledger update) publishes
    only the shards whose commit marker does not show the checkpoint yet. The task instance
    is recorded in the ledger as the committer.

    Where the shards' transactions run is ``commit_mode``:

    - ``"local"``: in this task's process, one shard after another.
    - ``"spark"``: ``spark-submit`` of the provider's commit application
      (``airflow_provider_eo/apps/commit.py``) with this task's Spark settings (the
      ``conn_id`` connection, ``conf``, ``deploy_mode``, ``env_vars`` ... as for
      :class:`SparkSubmitOperator`; the pipeline module is shipped in ``py_files``, and the
      ``kafka_conn_id``/``ledger_conn_id`` settings reach a client-mode driver in its
      environment, as for the prepare). Every shard is published by a Spark task on an
      executor and the driver keeps the ledger: no record passes through this worker. After
      the job ends the task reads the ledger and succeeds only when the checkpoint is
      COMMITTED. No Kafka connector jar is needed (the commit reads the staged files itself).
      A retry (or a cleared task) of a cluster-deploy-mode commit re-attaches to the commit
      driver it submitted for this checkpoint while that driver still runs (Airflow >= 3.3:
      the Spark provider's ``durable`` submission, the driver's id kept in the task's
      ``task_state_store`` per pipeline and checkpoint, never another checkpoint's). Once
      that driver has ended, in whatever state, the ledger decides: COMMITTED is done,
      anything else is committed again by a new driver (the shards its markers show
      committed are skipped, a zombie's transaction is fenced). Client deploy mode, and
      Airflow < 3.3, submit a new commit job on every try.
    - ``"auto"``: ``spark`` when the checkpoint has at least the pipeline's
      ``spark_commit_min_records`` records and the Spark connection's master is a cluster
      (not ``local``/``local[N]``), else ``local`` (also when there is no Spark connection).
    - ``None`` (default): the pipeline's ``commit_mode``.

    Asset event: give the task the pipeline's sink asset as an outlet
    (``outlets=[sink_asset(pipeline)]``, see :mod:`airflow_provider_eo.assets`; the
    ``eo_pipeline_group`` does it with ``sink_asset=``) and its success emits one event per
    committed checkpoint, whose ``extra`` is
    :func:`~airflow_provider_eo.assets.checkpoint_extra` (pipeline, checkpoint id, records,
    source ranges, dead letters, the committing task instance). Any ``kafka://`` outlet
    naming the sink topic gets it, whatever its server. A task that finds the checkpoint
    already COMMITTED (a retry after a crash that followed the commit, a cleared task)
    emits it again with ``already_committed`` true: Airflow emits an event on every success,
    and a consumer that dedupes on the checkpoint id loses nothing this way, whereas staying
    silent would lose the checkpoint whose first committer never reported success.

    Returns (XCom) ``{"pipeline", "checkpoint_id", "state", "records", "published",
    "shards_skipped", "note", "commit_mode", "publishers"}``; ``published`` counts records
    this try produced, ``commit_mode`` is where it ran (``local`` or ``spark``) and
    ``publishers`` names the process that published each shard (``shard``, ``host``,
    ``pid``, ``records``, ``executor``, ``attempt``, ``skipped``, ``publish_s``). In spark
    mode these come from the commit application's summary, which a client-mode driver
    writes to a file on this worker, with ``spark_driver`` (``host``, ``pid`` of the
    driver); a cluster-mode driver runs elsewhere, so there ``published`` and
    ``shards_skipped`` are ``None`` and ``publishers`` is left out (the driver's log has the
    summary line).

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param checkpoint_id: the checkpoint to commit, usually the plan's XCom. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param commit_mode: ``"local"``, ``"spark"``, ``"auto"`` or ``None`` (the pipeline's).
        (templated)
    :param conn_id: the ``spark`` connection of a spark-mode commit (and of ``auto``'s
        decision).
    :param name: the Spark application name (default ``eo-commit``; the application names
        its session ``eo-commit-<pipeline>-<checkpoint>``).
    :param kwargs: :class:`SparkSubmitOperator` arguments for a spark-mode commit (``conf``,
        ``deploy_mode``, ``env_vars``, ``executor_memory`` ...) and every
        :class:`BaseOperator` argument. A local commit ignores the Spark ones.
    """

    template_fields: Sequence[str] = (
        *PIPELINE_TEMPLATE_FIELDS,
        "checkpoint_id",
        "commit_mode",
        *SparkSubmitOperator.template_fields,
    )
    ui_color = "#e8fde9"
    operator_extra_links = (EoCheckpointLink(),)

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        commit_mode: str | None = None,
        conn_id: str = "spark_default",
        name: str = names.COMMIT_APP,
        **kwargs: Any,
    ) -> None:
        if commit_mode is not None and "{{" not in commit_mode and commit_mode not in COMMIT_MODES:
            raise ValueError(f"commit_mode {commit_mode!r} is not one of {', '.join(COMMIT_MODES)} or None")
        kwargs.setdefault("application", "")
        super().__init__(conn_id=conn_id, name=name, **kwargs)
        remember_spark_target(self, conn_id, kwargs.get("deploy_mode"))
        self.commit_mode = commit_mode
        self._submitted = False
        self._set_pipeline_args(
            pipeline=pipeline,
            checkpoint_id=checkpoint_id,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
        )

    def _spark_master(self) -> str | None:
        """The master of this task's Spark connection; ``None`` when it does not exist."""
        try:
            return spark_target(self)[0]
        except AirflowException as exc:  # AirflowNotFoundException: no such connection
            self.log.info("commit_mode auto: no usable Spark connection (%s); committing locally", exc)
            return None

    def resolve_commit_mode(self, pipeline: Pipeline, cp: CheckpointRecord) -> Literal["local", "spark"]:
        """Where this task commits ``cp`` (see :func:`choose_commit_mode`)."""
        requested = (self.commit_mode or "").strip() or pipeline.commit_mode
        return choose_commit_mode(
            requested,
            records=cp.records or 0,
            min_records=pipeline.spark_commit_min_records,
            master=self._spark_master,
        )

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        checkpoint_id = self.target_checkpoint()
        pipeline = self.resolve_pipeline()
        setattr(self, LINK_ATTR, (pipeline.name, checkpoint_id))  # the extra link's target
        with open_ledger(pipeline) as ledger:
            cp = ledger.get(pipeline.name, checkpoint_id)
        self.remember_for_lineage(checkpoint=cp)
        mode = self.resolve_commit_mode(pipeline, cp)
        if cp.state is CheckpointState.COMMITTED:
            out = _summary(pipeline, cp, mode, published=0, shards_skipped=0, note="already COMMITTED")
            out["publishers"] = []
        else:
            # The coordinator's listeners report a commit made by this try (metrics, notifiers)
            # and a failed one (a data-loss refusal, the abort a staging mismatch made).
            with open_ledger(pipeline) as ledger:
                coordinator = observe.coordinator_for(context, pipeline, ledger)
                if mode == "spark":
                    out = self._commit_on_spark(context, pipeline, cp, coordinator)
                else:
                    out = self._commit_here(pipeline, checkpoint_id, coordinator)
        self.remember_for_lineage(state=out["state"], records=out["records"])
        self.log.info(
            "pipeline %s: checkpoint %s %s (commit_mode %s): %s records published by this try, "
            "%s shard(s) already committed%s",
            pipeline.name,
            checkpoint_id,
            out["state"],
            out["commit_mode"],
            out["published"],
            out["shards_skipped"],
            f" ({out['note']})" if out["note"] else "",
        )
        self._emit_asset_event(
            context, pipeline, checkpoint_id, already_committed=cp.state is CheckpointState.COMMITTED
        )
        return out

    def _emit_asset_event(
        self, context: Context, pipeline: Pipeline, checkpoint_id: int, *, already_committed: bool
    ) -> None:
        """Give the sink asset's event (an outlet naming the sink topic) the checkpoint's
        ``extra``, read from the ledger now that it shows the checkpoint COMMITTED."""
        sinks = topic_outlets(self.outlets, pipeline.sink_topic)
        if not sinks:
            other = [a.uri for a in self.outlets if topic_of(a) is not None]
            if other:
                self.log.warning(
                    "pipeline %s: no outlet names the sink topic %r (Kafka outlets: %s); their "
                    "events carry no checkpoint",
                    pipeline.name,
                    pipeline.sink_topic,
                    ", ".join(other),
                )
            return
        with open_ledger(pipeline) as ledger:
            done = ledger.get(pipeline.name, checkpoint_id)
        extra = checkpoint_extra(pipeline, done, already_committed=already_committed)
        emit(context, sinks, extra)
        self.log.info(
            "pipeline %s: checkpoint %s announced on %s%s",
            pipeline.name,
            checkpoint_id,
            ", ".join(a.uri for a in sinks),
            " (again: it was already COMMITTED)" if already_committed else "",
        )

    def _commit_here(
        self, pipeline: Pipeline, checkpoint_id: int, coordinator: Coordinator
    ) -> dict[str, Any]:
        """The local commit, in this process (a no-op on a COMMITTED checkpoint)."""
        result = coordinator.commit(checkpoint_id, commit_mode="local")
        out = _summary(
            pipeline,
            result.checkpoint,
            result.mode,
            published=result.published,
            shards_skipped=result.shards_skipped,
            note=result.note,
        )
        out["publishers"] = [p.as_dict() for p in sorted(result.publishers, key=lambda p: p.shard)]
        return out

    def _commit_on_spark(
        self, context: Context, pipeline: Pipeline, cp: CheckpointRecord, coordinator: Coordinator
    ) -> dict[str, Any]:
        """spark-submit the commit application for ``cp`` (through ``coordinator``), then read
        the ledger."""
        checkpoint_id = cp.checkpoint_id
        if cp.state is not CheckpointState.PREPARED:
            raise NotPrepared(
                f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} is {cp.state.value}, not "
                "PREPARED; run (or retry) its prepare step first. Nothing was submitted."
            )
        _master, deploy_mode = spark_target(self)
        summary_dir = tempfile.mkdtemp(prefix="eo-commit-") if deploy_mode != "cluster" else None
        summary_file = os.path.join(summary_dir, "summary.json") if summary_dir else None

        def submit(checkpoint_id: int) -> tuple[Exception | None, dict[str, Any] | None]:
            """spark-submit's failure (the ledger decides) and the application's summary."""
            try:
                args = CommitAppArgs(self.pipeline, checkpoint_id, summary_file=summary_file).to_argv()
                if configure_submit(
                    self,
                    context,
                    application=commit_application(),
                    application_args=args,
                    pipeline_ref=self.pipeline,
                    pipeline_name=pipeline.name,
                    overrides=self.pipeline_overrides(pipeline),
                    spark_kafka=False,
                ):
                    self.log.info("commit job: cluster deploy mode, the Spark provider tracks the driver")
                self.log.info(
                    "pipeline %s: committing checkpoint %s (%s records) on Spark executors",
                    pipeline.name,
                    checkpoint_id,
                    cp.records,
                )
                # Re-attach only to a commit driver of this checkpoint (see the class docstring).
                resume_submission(
                    self,
                    context,
                    key=resume_key("commit", pipeline.name, checkpoint_id),
                    what=f"pipeline {pipeline.name!r}: the commit of checkpoint {checkpoint_id}",
                )
                self._submitted = True
                failure: Exception | None = None
                try:
                    SparkSubmitOperator.execute(self, context)
                except (AirflowException, RuntimeError) as exc:
                    # spark-submit's failure, or a tracked cluster driver's final state (the
                    # Spark provider raises RuntimeError for those): the ledger decides below.
                    failure = exc
                return failure, _read_summary(summary_file)
            finally:
                end_submit(self)  # the connection hand-off, if the driver never read it
                if summary_dir:
                    with contextlib.suppress(OSError):
                        for leftover in Path(summary_dir).iterdir():
                            leftover.unlink()
                        os.rmdir(summary_dir)

        done, (failure, summary) = coordinator.commit_with(checkpoint_id, submit)
        if done.state is not CheckpointState.COMMITTED:
            raise CommitNotRecorded(
                f"pipeline {pipeline.name!r}: the commit job finished but checkpoint {checkpoint_id} "
                f"is {done.state.value}; see the driver log above, then retry this task"
                + (f" ({failure})" if failure else "")
            ) from failure
        if failure is not None:
            self.log.warning(
                "pipeline %s: checkpoint %s is COMMITTED although spark-submit reported a failure "
                "after it (%s)",
                pipeline.name,
                checkpoint_id,
                failure,
            )
        if summary is None:
            return _summary(pipeline, done, "spark", published=None, shards_skipped=None, note="")
        publishers = list(summary.get("publishers") or [])
        out = _summary(
            pipeline,
            done,
            "spark",
            published=summary.get("published"),
            shards_skipped=sum(1 for p in publishers if p.get("skipped")),
            note=str(summary.get("note") or ""),
        )
        out["publishers"] = publishers
        out["spark_driver"] = summary.get("committer")
        return out

    def on_kill(self) -> None:
        """Stop the commit job this task submitted (nothing to do for a local commit: its
        process is the one being killed)."""
        if self._submitted:
            SparkSubmitOperator.on_kill(self)


def _summary(
    pipeline: Pipeline,
    cp: CheckpointRecord,
    mode: str,
    *,
    published: int | None,
    shards_skipped: int | None,
    note: str,
) -> dict[str, Any]:
    """The task's XCom without the publishers."""
    return {
        "pipeline": pipeline.name,
        "checkpoint_id": cp.checkpoint_id,
        "state": cp.state.value,
        "records": cp.records,
        "published": published,
        "shards_skipped": shards_skipped,
        "note": note,
        "commit_mode": mode,
    }


def _read_summary(path: str | None) -> dict[str, Any] | None:
    """The commit application's summary from ``path`` (``None`` when there is none: a
    cluster-mode driver, or a job that did not get that far)."""
    if not path:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
