"""Durable spark-submit for eo's operators: which Spark driver a try of a task may re-attach to.

On Airflow >= 3.3, :class:`SparkSubmitOperator` is a ``ResumableJobMixin``. When it tracks
a cluster-mode driver (YARN cluster with ``yarn_track_via_rm_api=True``, Kubernetes with
``track_driver_via_k8s_api=True``, a ``spark://`` master with ``deploy_mode="cluster"``,
which Spark refuses for Python applications such as eo's) it stores the driver's id in
the task instance's ``task_state_store`` under ``external_id_key`` before it polls, and a
later try of the task reads it back: a driver that still runs is re-attached to, a
FINISHED one counts as success and nothing is submitted, a failed one is submitted again.
In client deploy mode nothing is stored or read (the driver is the task's child and ends
with it). Below Airflow 3.3 there is no store and every try submits (``durable`` has no
effect there).

The store belongs to the task instance (DAG run, task id, map index), not to one try: it
outlives retries and clears. One key per task, the provider's default, is wrong for eo:

- the backfill submits one prepare per checkpoint within one try: its second submission
  would find the first one's FINISHED driver and submit nothing, and the ledger would say
  the second checkpoint was never prepared, on every retry;
- a task cleared onto another checkpoint would find the driver of the checkpoint it
  worked on before.

So before each submission eo's operators call :func:`resume_submission`, which

1. keys the driver's id by the work it does (:func:`resume_key`: the application, the
   pipeline, the checkpoint), and the provider's Kubernetes driver-status cache with it;
2. lets the ledger, never the stored driver's final state, decide whether that work is
   done: the operator reads the ledger first and submits only work that is not done
   (a PREPARED checkpoint is not prepared again, a COMMITTED one not committed again). A
   stored driver for the same work that still runs is re-attached to (no second
   submission). One that ended, in any state, or that the cluster no longer knows, or
   whose status cannot be read, is forgotten, and the application is submitted again.

Submitting again is safe for every application: preparing a PREPARED checkpoint does
nothing and two prepares of one checkpoint race to a single winner; a commit skips the
shards its markers show committed and fences a zombie's transaction; a second streaming
driver of a pipeline is refused while the first one's run is alive in the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_eo.version_compat import Context

#: The provider's own suffix for the cached Kubernetes driver phase (its attribute
#: ``_K8S_DRIVER_STATUS_KEY``), scoped like the driver id.
K8S_STATUS_SUFFIX = "k8s_driver_status"

Application = Literal["prepare", "commit", "stream"]
Decision = Literal["reattach", "forget"]


def resume_key(application: Application, pipeline_name: str, checkpoint_id: int | None = None) -> str:
    """The ``task_state_store`` key of the driver doing ``application`` for one checkpoint
    of a pipeline (``eo:prepare:orders:7``), or for the whole pipeline (the stream:
    ``eo:stream:orders``). Pipeline names hold only letters, digits, ``.``, ``_`` and
    ``-``, so the ``:``-separated parts cannot collide."""
    parts = ["eo", application, pipeline_name]
    if checkpoint_id is not None:
        parts.append(str(int(checkpoint_id)))
    return ":".join(parts)


def scope_resume_keys(task: SparkSubmitOperator, key: str) -> None:
    """Make ``task``'s next durable submission store (and look for) its driver under ``key``:
    the mixin's ``external_id_key`` and, when the Spark provider has one, its Kubernetes
    driver-status cache, which otherwise answers "Succeeded" for any later driver of the
    task once one driver succeeded."""
    task.external_id_key = key
    if hasattr(task, "_K8S_DRIVER_STATUS_KEY"):
        task._K8S_DRIVER_STATUS_KEY = f"{key}:{K8S_STATUS_SUFFIX}"


def resume_submission(task: SparkSubmitOperator, context: Context, *, key: str, what: str) -> Decision | None:
    """Get ``task`` ready to submit the work named by ``key`` (see the module docstring):
    scope its keys, then look at the driver stored for that work, if any.

    Call it once the ledger shows the work is not done, right before
    ``SparkSubmitOperator.execute``. Returns ``"reattach"`` when the stored driver still
    runs (``execute`` then re-attaches to it), ``"forget"`` when a stored driver was
    dropped (``execute`` submits anew), ``None`` when there is nothing to decide: no
    stored driver, ``durable=False``, or no ``task_state_store`` (Airflow < 3.3).

    :param key: from :func:`resume_key`.
    :param what: the work, for the log (``"pipeline 'orders': the prepare of checkpoint 7"``).
    """
    scope_resume_keys(task, key)
    store = context.get("task_state_store")
    if store is None or not getattr(task, "durable", False):
        return None
    external_id = store.get(key)
    if not external_id:
        return None
    status: str | None = None
    try:
        status = task.get_job_status(external_id, context)
        active = task.is_job_active(status)
    except Exception as exc:  # any failure to read it: the ledger decides, as for an ended driver
        task.log.warning("%s: cannot read the status of its Spark driver %s: %s", what, external_id, exc)
        active = False
    finally:
        # Reading the status built the operator's hook; execute builds its own from the
        # settings it has then (OpenLineage properties are added to conf first).
        task._hook = None
    if active:
        task.log.info(
            "%s: its Spark driver %s is still %s: re-attaching to it instead of submitting again",
            what,
            external_id,
            status,
        )
        return "reattach"
    task.log.info(
        "%s: its earlier Spark driver %s is %s and the ledger shows the work not done: submitting again",
        what,
        external_id,
        status or "unknown",
    )
    store.delete(key)
    if hasattr(task, "_K8S_DRIVER_STATUS_KEY"):
        store.delete(f"{key}:{K8S_STATUS_SUFFIX}")
    return "forget"
