"""Prepare a checkpoint with ``spark-submit`` (the provider's PySpark application)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo import names
from airflow_provider_eo.apps.args import PrepareAppArgs
from airflow_provider_eo.connections import ConnectionSettings, remove_handoff, write_handoff
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.operators._openlineage import OpenLineageMixin
from airflow_provider_eo.operators._resume import resume_key, resume_submission
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    open_ledger,
)
from airflow_provider_eo.spark.shipping import ship_py_files
from airflow_provider_eo.version_compat import (
    AirflowException,
    AirflowFailException,
    BaseHook,
    Context,
    task_identity,
)

PREPARE_MODULE = "airflow_provider_eo.apps.prepare"


class PrepareNotRecorded(AirflowException):
    """spark-submit returned but the ledger does not show the checkpoint PREPARED."""


def prepare_application() -> str:
    """File path of the PySpark application ``airflow_provider_eo/apps/prepare.py``."""
    return provider_application(PREPARE_MODULE)


def module_root(pipeline_ref: str) -> str | None:
    """The ``sys.path`` entry the pipeline's module is imported from (e.g. the DAGs folder),
    so the Spark driver can import the same reference."""
    module = pipeline_ref.split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    levels = module.count(".") + (1 if Path(spec.origin).name == "__init__.py" else 0)
    return str(Path(spec.origin).parents[levels])


def _merge_csv(*values: str | None) -> str | None:
    seen: list[str] = []
    for value in values:
        for item in (value or "").split(","):
            item = item.strip()
            if item and item not in seen:
                seen.append(item)
    return ",".join(seen) or None


def local_driver_env(pipeline_ref: str) -> dict[str, str]:
    """Environment of a client-mode spark-submit: this interpreter for the driver and the
    Python workers (the venv with pyspark, pyarrow and this package), its ``bin`` first
    on PATH (for ``spark-submit``), and the pipeline module's root on PYTHONPATH."""
    python = sys.executable
    env = {
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "PATH": os.pathsep.join([os.path.dirname(python), os.environ.get("PATH", "")]),
    }
    root = module_root(pipeline_ref)
    paths = [p for p in (root, os.environ.get("PYTHONPATH")) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def provider_application(module: str) -> str:
    """File path of one of the provider's PySpark applications (``module`` is dotted)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise AirflowException(f"cannot locate {module}; is airflow-provider-eo installed?")
    return spec.origin


def remember_spark_target(task: SparkSubmitOperator, conn_id: str, deploy_mode: str | None) -> None:
    """Keep the Spark connection id and deploy mode given to ``task``'s constructor (the
    provider stores them privately), so :func:`spark_target` needs no private attribute."""
    task.eo_spark_conn_id = conn_id
    task.eo_deploy_mode = deploy_mode


def spark_target(task: SparkSubmitOperator) -> tuple[str, str]:
    """``(master, deploy mode)`` the task submits to, read as SparkSubmitHook reads them but
    through public surfaces: the task's ``deploy_mode`` argument, else the connection's
    ``deploy-mode`` extra, else ``client``; the master from the connection's host/port."""
    conn_id = getattr(task, "eo_spark_conn_id", None) or "spark_default"
    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    host = conn.host or ""
    master = f"{host}:{conn.port}" if conn.port and host else host
    deploy_mode = getattr(task, "eo_deploy_mode", None) or extra.get("deploy-mode") or "client"
    return master, str(deploy_mode)


def _rebuild_hook(task: SparkSubmitOperator) -> None:
    """Let the next ``SparkSubmitOperator.execute`` build its hook from the task's current
    settings (the operator builds it once and caches it; a task that submits more than once,
    the backfill, changes its arguments between submissions)."""
    task._hook = None


def add_task_time_jars(
    task: SparkSubmitOperator,
    pipeline_name: str,
    staging_dir: str | None = None,
    *,
    optional_worker_jars: bool = True,
) -> None:
    """Add to ``task.jars`` what the prepare needs and is already installed on this worker,
    never running a build tool (no Maven, no javac at task time):

    - the Kafka connector, unless the task's ``packages``/``jars``/``conf`` already name it
      (as Spark users give it, e.g. ``packages="org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"``):
      the jars ``eo setup jars`` (or ``eo dev jars``) fetched; when neither, the task fails
      saying what to set, before anything is submitted;
    - eo's JVM partitioner jar when ``eo setup jars`` built it; otherwise the prepare
      computes sink partitions with its Arrow UDF (same result, slower), logged here;
    - with a ``staging_dir`` under ``s3a://``, Hadoop's S3A connector (``hadoop-aws`` and
      its AWS SDK bundle) when ``eo setup jars --s3`` fetched it, unless the task names it
      already; without it, logged (Spark's image must have it, as EMR's and Dataproc's do).

    With ``optional_worker_jars`` false (a driver that cannot read this worker's files: a
    Kubernetes pod with no upload path), the optional jars of this worker (the partitioner,
    the S3A connector) are left out, logged; the image may hold them (give them as
    ``jars="local:///..."``).
    """
    from airflow_provider_eo.spark.session import connector_coordinate, names_connector, names_hadoop_aws
    from airflow_provider_eo.stack.javac import cached_udf_jar
    from airflow_provider_eo.stack.maven import (
        cached_hadoop_aws_jars,
        cached_spark_kafka_jars,
        installed_spark_version,
    )
    from airflow_provider_eo.staging_fs import is_s3_location

    conf = dict(task.conf or {})
    try:
        version: str | None = installed_spark_version()
    except ImportError:
        version = None
    jars: list[str] = []
    if not names_connector(task.packages, task.jars, conf.get("spark.jars.packages"), conf.get("spark.jars")):
        cached = cached_spark_kafka_jars(version) if version else None
        if not cached:
            raise AirflowFailException(
                f"pipeline {pipeline_name!r}: the Spark Kafka connector is not configured for task "
                f"{task.task_id!r}: give it as for any Spark job, e.g. packages="
                f"'{connector_coordinate(version or '<your Spark version>')}' (or jars=...), or run "
                "`eo setup jars` on this worker. Nothing was submitted."
            )
        jars += [str(p) for p in cached]
    given = (task.packages, task.jars, conf.get("spark.jars.packages"), conf.get("spark.jars"))
    if is_s3_location(staging_dir) and not names_hadoop_aws(*given):
        s3a = cached_hadoop_aws_jars() if version and optional_worker_jars else None
        if s3a:
            jars += [str(p) for p in s3a]
        else:
            task.log.warning(
                "pipeline %s stages under %s, and Hadoop's S3A connector (hadoop-aws) is neither "
                "given to task %r (packages/jars) nor installed on this worker (`eo setup jars --s3`): "
                "Spark's own classpath must have it, or the prepare fails on S3AFileSystem",
                pipeline_name,
                staging_dir,
                task.task_id,
            )
    udf = cached_udf_jar(version) if version else None
    if udf is not None and optional_worker_jars:
        jars.append(str(udf))
    elif udf is not None:
        task.log.info(
            "pipeline %s: the driver cannot read this worker's files, so eo's JVM partitioner jar is "
            "not added (give the image's copy as jars='local:///...'); else the prepare computes sink "
            "partitions with its Arrow UDF",
            pipeline_name,
        )
    else:
        task.log.warning(
            "pipeline %s: eo's JVM partitioner jar is not installed on this worker (`eo setup jars` "
            "builds it); the prepare computes sink partitions with its Arrow UDF (same result, slower)",
            pipeline_name,
        )
    if jars:
        task.jars = _merge_csv(task.jars, ",".join(jars))


#: Spark's setting for where spark-submit uploads a Kubernetes cluster-mode driver's local files.
K8S_UPLOAD_PATH = "spark.kubernetes.file.upload.path"


def _local_files(task: SparkSubmitOperator) -> list[str]:
    """The files of ``task``'s submission that are paths on this worker: no ``local://``
    (inside the container image) and no remote scheme (``s3a://``, ``https://`` ...)."""
    conf = dict(task.conf or {})
    items = [task.application]
    for csv in (task.py_files, task.jars, task.files, conf.get("spark.jars")):
        items += (csv or "").split(",")
    out = []
    for item in (i.strip() for i in items if i and i.strip()):
        if "://" not in item or item.startswith("file://"):
            out.append(item)
    return out


def check_kubernetes_submit(task: SparkSubmitOperator, master: str, deploy_mode: str) -> None:
    """Refuse, before anything is submitted, a Kubernetes cluster-mode submission that names
    files of this worker while Spark has nowhere to upload them.

    The driver runs in a pod, so every file of the submission must be in its image
    (``local:///...``: the application, e.g.
    ``application="local:///opt/venv/lib/python3.11/site-packages/airflow_provider_eo/apps/prepare.py"``,
    and jars baked into the image) or be uploaded by ``spark-submit`` to
    ``spark.kubernetes.file.upload.path`` (an ``s3a://``, ``gs://`` or ``hdfs://`` folder
    both sides reach), which is what happens to the provider's application, the shipped
    pipeline module (``py_files``) and the jars ``eo setup jars`` installed here when it is set.

    :raises AirflowFailException: a local file and no upload path; names the files.
    """
    if not master.startswith("k8s://") or deploy_mode != "cluster":
        return
    local = _local_files(task)
    if local and not dict(task.conf or {}).get(K8S_UPLOAD_PATH):
        raise AirflowFailException(
            f"task {task.task_id!r}: Kubernetes cluster deploy mode runs the driver in a pod, which "
            f"cannot read this worker's files {', '.join(local)}. Set conf "
            f"{{'{K8S_UPLOAD_PATH}': 's3a://BUCKET/spark-uploads'}} so spark-submit uploads them, or "
            "give each one as local:///PATH inside the driver image (application=, jars=). "
            "Nothing was submitted."
        )


def configure_submit(
    task: SparkSubmitOperator,
    context: Context,
    *,
    application: str,
    application_args: Sequence[str],
    pipeline_ref: str,
    pipeline_name: str,
    overrides: ConnectionSettings | None,
    ship: Sequence[str | None] = (),
    spark_kafka: bool = True,
    staging_dir: str | None = None,
) -> bool:
    """Set ``task`` up to spark-submit one of the provider's applications: the application
    (unless the task names its own), its arguments followed by ``--actor-json`` (this task
    instance, recorded in the ledger), the jars (:func:`add_task_time_jars`, unless
    ``spark_kafka`` is false: an application that never reads Kafka through Spark SQL, the
    commit, needs neither the connector nor eo's partitioner jar; ``staging_dir``, where the
    application stages, for Hadoop's S3A connector), the user's modules in
    ``py_files`` (the pipeline module and the ``ship`` references, e.g. the transform: see
    :mod:`~airflow_provider_eo.spark.shipping`), and in client mode the driver's
    environment (:func:`local_driver_env`, ``overrides``). Returns ``True`` in cluster
    deploy mode. Uses only the Spark provider's public surface (the connection, the
    operator's arguments and ``execute``), no SparkSubmitHook internals.

    Shared by the submit, backfill and stream operators; may be called more than once on
    the same task (the next ``execute`` builds its hook afresh; the merges are idempotent).

    :param overrides: the settings the task read from Airflow connections
        (:meth:`~airflow_provider_eo.operators.base.PipelineTaskMixin.pipeline_overrides`).
        A client-mode driver is handed them through a private file
        (:mod:`airflow_provider_eo.connections`; removed by :func:`end_submit`); a
        cluster-mode driver gets only the connection ids and reads the connections itself.
        Neither way puts a secret on the command line, in the environment or in Spark conf.
    """
    end_submit(task)  # a previous submit's hand-off, if its driver never read it
    task.application = task.application or application
    conn_args: list[str] = []
    if overrides and overrides.kafka_conn_id:
        conn_args += ["--kafka-conn-id", overrides.kafka_conn_id]
    if overrides and overrides.ledger_conn_id:
        conn_args += ["--ledger-conn-id", overrides.ledger_conn_id]
    task.application_args = [
        *application_args,
        *conn_args,
        "--actor-json",
        json.dumps(task_identity(context)),
    ]
    master, deploy_mode = spark_target(task)
    if spark_kafka:
        pod = master.startswith("k8s://") and deploy_mode == "cluster"
        uploads = bool(dict(task.conf or {}).get(K8S_UPLOAD_PATH))
        add_task_time_jars(task, pipeline_name, staging_dir, optional_worker_jars=not pod or uploads)
    shipped = ship_py_files([pipeline_ref, *ship])
    if shipped:
        task.py_files = _merge_csv(task.py_files, ",".join(shipped))
        task.log.info("shipping to the executors (py_files): %s", ", ".join(shipped))
    check_kubernetes_submit(task, master, deploy_mode)
    _rebuild_hook(task)
    env = {**(task.env_vars or {})}
    env.pop(names.CONNECTIONS_FILE_ENV, None)
    if deploy_mode == "cluster":
        if overrides:
            task.log.info(
                "pipeline %s: cluster deploy mode: the driver reads connection(s) %s itself "
                "(Airflow's secrets backend or AIRFLOW_CONN_* on the host it runs on)",
                pipeline_name,
                ", ".join(i for i in (overrides.kafka_conn_id, overrides.ledger_conn_id) if i),
            )
        task.env_vars = env
        return True
    env = {**local_driver_env(pipeline_ref), **env}
    if overrides:
        handoff = write_handoff(overrides)
        task._eo_handoff = str(handoff)
        # Into this task's own environment, which spark-submit and so a client-mode driver
        # inherit on every cluster manager (the Spark provider turns ``env_vars`` into Spark
        # conf on YARN and Kubernetes). Only the path travels; end_submit takes it back.
        os.environ[names.CONNECTIONS_FILE_ENV] = str(handoff)
        # Hadoop's S3A in the driver's JVM reads credentials from its environment, not from
        # Python: an AWS connection's staging credentials go there, for this submit only
        # (unless this worker's own AWS_* environment gives them: it comes first).
        aws_env = aws_jvm_environment(overrides)
        os.environ.update(aws_env)
        task._eo_aws_env = list(aws_env)
    task.env_vars = env
    return False


def aws_jvm_environment(overrides: ConnectionSettings) -> dict[str, str]:
    """The ``AWS_*`` variables a client-mode driver's JVM needs for the AWS connection's
    staging credentials; empty without one, or when this process's environment already has
    credentials (which come first: :mod:`airflow_provider_eo.staging_fs`)."""
    aws = overrides.aws
    if not (aws.get("access_key") and aws.get("secret_key")):
        return {}
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return {}
    env = {"AWS_ACCESS_KEY_ID": str(aws["access_key"]), "AWS_SECRET_ACCESS_KEY": str(aws["secret_key"])}
    if aws.get("session_token"):
        env["AWS_SESSION_TOKEN"] = str(aws["session_token"])
    return env


def end_submit(task: SparkSubmitOperator) -> None:
    """Remove the connection hand-off file of the task's last submit (the driver deletes it
    when it reads it; this covers a driver that never started)."""
    remove_handoff(getattr(task, "_eo_handoff", None))
    task._eo_handoff = None
    os.environ.pop(names.CONNECTIONS_FILE_ENV, None)
    for key in getattr(task, "_eo_aws_env", None) or ():
        os.environ.pop(key, None)
    task._eo_aws_env = []


def submit_prepare(
    task: SparkSubmitOperator,
    context: Context,
    *,
    pipeline_ref: str,
    pipeline_name: str,
    checkpoint_id: int,
    overrides: ConnectionSettings | None,
    extra_args: Sequence[str] = (),
    ship: Sequence[str | None] = (),
    staging_dir: str | None = None,
) -> None:
    """spark-submit the provider's prepare application for one checkpoint, with the
    Spark settings of ``task`` (any :class:`SparkSubmitOperator`: connection, ``conf``,
    ``jars``, ``env_vars`` ...). Shared by the submit and the backfill operators.

    Returns when spark-submit (client mode) or the provider's driver tracking (cluster
    mode) has finished; the caller then reads the ledger. A failed driver fails
    the task with spark-submit's (or the tracked driver's) reason.
    ``extra_args`` are appended to the application's arguments (the backfill's
    ``--backfill-sink-topic``/``--backfill-transform``). May be called more than once on
    the same task.

    Call it only for a checkpoint the ledger shows not yet PREPARED. In cluster deploy
    mode on Airflow >= 3.3 the Spark provider keeps the driver's id in the task's
    ``task_state_store``; here it is kept per pipeline and checkpoint
    (:mod:`~airflow_provider_eo.operators._resume`), so a retry re-attaches to this
    checkpoint's driver while it still runs, never to another checkpoint's, and submits
    anew once that driver has ended.

    :param pipeline_ref: ``"module:ATTR"`` given to the application.
    :param pipeline_name: the pipeline's name, for messages.
    :param checkpoint_id: the checkpoint to prepare.
    :param overrides: see :func:`configure_submit`.
    :param staging_dir: where the checkpoint is staged (see :func:`configure_submit`).
    """
    if configure_submit(
        task,
        context,
        application=prepare_application(),
        application_args=[*PrepareAppArgs(pipeline_ref, checkpoint_id).to_argv(), *extra_args],
        pipeline_ref=pipeline_ref,
        pipeline_name=pipeline_name,
        overrides=overrides,
        ship=ship,
        staging_dir=staging_dir,
    ):
        # The provider's own driver tracking (YARN and Kubernetes as configured on the
        # operator; Spark refuses cluster deploy mode for Python applications on a
        # standalone master) waits for the driver and fails the task with its final state
        # when it dies; the ledger then says PREPARED or not.
        task.log.info("prepare job: cluster deploy mode, the Spark provider tracks the driver")
    try:
        # The driver's id is kept per checkpoint: a retry re-attaches only to this checkpoint's.
        resume_submission(
            task,
            context,
            key=resume_key("prepare", pipeline_name, checkpoint_id),
            what=f"pipeline {pipeline_name!r}: the prepare of checkpoint {checkpoint_id}",
        )
        SparkSubmitOperator.execute(task, context)
    finally:
        end_submit(task)


class EoSubmitOperator(OpenLineageMixin, PipelineTaskMixin, SparkSubmitOperator):
    """Run the provider's prepare job for one checkpoint with ``spark-submit``.

    A :class:`SparkSubmitOperator` (any ``spark`` connection, client or cluster deploy
    mode) whose application is ``airflow_provider_eo/apps/prepare.py`` and whose
    arguments name the pipeline, the checkpoint and this task instance (recorded in the
    ledger). The Kafka connector jars are added to ``jars`` at execute time.

    Idempotent: when the checkpoint is already PREPARED or COMMITTED nothing is
    submitted (a retry after the job finished, a cleared task). A retry after a failed
    job prepares the same checkpoint again in a new attempt folder.

    In client mode the task runs the driver; in cluster mode the Spark provider tracks the
    driver until it ends (YARN and Kubernetes as configured on the operator; Spark refuses
    cluster deploy mode for Python applications on a standalone master). Either way a dead
    driver fails the task with its reason (spark-submit's exit and log lines, or the
    tracked driver's final state), and the task succeeds once the ledger shows the
    checkpoint PREPARED. On Airflow >= 3.3 a retry in cluster deploy mode re-attaches to
    this checkpoint's driver while it still runs (never to another checkpoint's) and submits
    anew once it has ended; below 3.3 every try submits.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param checkpoint_id: the checkpoint to prepare, usually the plan's XCom, e.g.
        ``"{{ ti.xcom_pull(task_ids='eo.plan')['checkpoint_id'] }}"``. (templated)
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's config;
        passed to the client-mode driver through its environment. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL (same path as ``kafka_conn_id``). (templated)
    :param conn_id: the Spark connection (``spark_default``); see
        :class:`SparkSubmitOperator` for every other argument (``conf``, ``jars``,
        ``env_vars``, ``deploy_mode``, ...).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        *PIPELINE_TEMPLATE_FIELDS,
        "checkpoint_id",
    )
    ui_color = "#fdf2e8"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        conn_id: str = "spark_default",
        name: str = names.PREPARE_APP,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("application", "")
        super().__init__(conn_id=conn_id, name=name, **kwargs)
        remember_spark_target(self, conn_id, kwargs.get("deploy_mode"))
        self._set_pipeline_args(
            pipeline=pipeline,
            checkpoint_id=checkpoint_id,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
        )

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        checkpoint_id = self.target_checkpoint()
        pipeline = self.resolve_pipeline()
        with open_ledger(pipeline) as ledger:
            cp = ledger.get(pipeline.name, checkpoint_id)
        self.remember_for_lineage(checkpoint=cp)
        summary: dict[str, Any] = {"pipeline": pipeline.name, "checkpoint_id": checkpoint_id}
        if cp.state in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            self.log.info(
                "pipeline %s: checkpoint %s is already %s; nothing to submit",
                pipeline.name,
                checkpoint_id,
                cp.state.value,
            )
            return {**summary, "state": cp.state.value, "submitted": False}
        if cp.state is CheckpointState.ABORTED:
            raise AirflowFailException(
                f"pipeline {pipeline.name!r}: checkpoint {checkpoint_id} was ABORTED"
                f"{f' ({cp.abort_reason})' if cp.abort_reason else ''}; the next DAG run replans "
                "its range"
            )
        submit_prepare(
            self,
            context,
            pipeline_ref=self.pipeline,
            pipeline_name=pipeline.name,
            checkpoint_id=checkpoint_id,
            overrides=self.pipeline_overrides(pipeline),
            ship=[pipeline.transform],
            staging_dir=pipeline.staging_dir,
        )
        with open_ledger(pipeline) as ledger:
            cp = ledger.get(pipeline.name, checkpoint_id)
        self.remember_for_lineage(checkpoint=cp)
        if cp.state not in (CheckpointState.PREPARED, CheckpointState.COMMITTED):
            raise PrepareNotRecorded(
                f"pipeline {pipeline.name!r}: the prepare job finished but checkpoint {checkpoint_id} "
                f"is {cp.state.value}; see the driver log above, then retry this task"
            )
        return {
            **summary,
            "state": cp.state.value,
            "submitted": True,
            "records": cp.records,
            "attempt": cp.prepared_attempt,
            "spark_app_id": cp.spark_app_id,
        }
