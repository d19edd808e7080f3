"""Example: the demo pipeline in streaming mode (one long-running Spark application).

Four DAGs:

- ``eo_stream``: one task, :class:`EoStreamOperator` with ``commit="inline"``: the
  application plans, prepares and commits a checkpoint every ``interval`` seconds until
  it is stopped (mark the task failed/success, ``eo stop``, a stop-with-savepoint) or a
  bound in the run conf is reached (``checkpoints`` or ``duration``). A task retry
  restarts it, and it resumes the unfinished checkpoints from the ledger first.
- ``eo_stream_detached``: the same with ``deferrable=True``: the task starts the driver
  detached on the worker and waits in the triggerer, holding no worker slot while the
  stream runs; it ends with the stream (bounds, ``eo stream-stop``, ``eo stop``, marking
  the task failed/success asks the stream to stop). A retry re-attaches to a driver that
  still runs, else starts a new one, which resumes from the ledger.
- ``eo_stream_prepare``: the same application with ``commit="airflow"``: it only
  prepares; checkpoints stay PREPARED for the commit DAG.
- ``eo_stream_commit``: scheduled on an asset whose ``AssetWatcher`` runs
  :class:`EoPreparedCheckpointTrigger` in the triggerer (one asset event per checkpoint
  that became PREPARED); each run commits the lowest PREPARED checkpoint with
  :class:`EoCommitOperator` (skips when there is none: a repeated event). Checkpoints
  commit strictly in order; ``max_active_runs=1``.

Assets: the commit task of ``eo_stream_commit`` has the sink topic's asset as an outlet (one
event per checkpoint it commits), and that asset carries the watcher of stream-committed
checkpoints (``sink_asset(..., stream_commits=True)``): each checkpoint ``eo_stream`` or
``eo_stream_detached`` commits in its driver is an event on it as well, with the same
checkpoint under ``extra["payload"]``. The watcher runs while a DAG scheduled on the asset
(``dags/eo_downstream.py``) is active.

The worker slot: in client deploy mode (``spark_default`` = ``local[2]``) the ``stream``
task of ``eo_stream`` runs the driver and holds its slot for the whole run; the one of
``eo_stream_detached`` does not (see ``airflow_provider_eo.operators.stream``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, AssetWatcher, Param, task
from eo_demo_pipelines import demo_pipeline

from airflow_provider_eo.assets import sink_asset
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.stream import EoStreamOperator
from airflow_provider_eo.triggers.stream import EoPreparedCheckpointTrigger

PIPELINE = "eo_demo_pipelines:demo_pipeline"
#: The sink topic's asset, as every DAG file naming it builds it (Airflow keeps an asset's
#: watchers as the file parsed last declares them).
SINK = sink_asset(PIPELINE, stream_commits=True)
SPARK_CONN_ID = os.environ.get("EO_SPARK_CONN_ID", "spark_default")
INTERVAL_S = float(os.environ.get("EO_STREAM_INTERVAL_S", "5"))
DEFAULTS = {
    "retries": int(os.environ.get("EO_STREAM_RETRIES", "2")),
    "retry_delay": timedelta(seconds=float(os.environ.get("EO_RETRY_DELAY_S", "30"))),
}
BOUNDS = {
    "checkpoints": Param(None, type=["null", "integer"], minimum=1, title="Stop after N checkpoints"),
    "duration": Param(None, type=["null", "number"], minimum=1, title="Stop after S seconds"),
}


HEARTBEAT_S = float(os.environ.get("EO_STREAM_HEARTBEAT_S", "5"))


def _stream(commit: str, *, deferrable: bool = False) -> EoStreamOperator:
    return EoStreamOperator(
        task_id="stream",
        pipeline=PIPELINE,
        interval=INTERVAL_S,
        commit=commit,
        checkpoints="{{ params.checkpoints }}",
        duration="{{ params.duration }}",
        spark_conn_id=SPARK_CONN_ID,
        # Explicit: eo_stream and eo_stream_prepare show the driver as the task's child
        # whatever Airflow's [operators] default_deferrable says; eo_stream_detached defers.
        deferrable=deferrable,
        heartbeat=HEARTBEAT_S,
        poll_interval=min(5.0, HEARTBEAT_S),
        log_dir=os.environ.get("EO_STREAM_LOG_DIR") or None,  # the detached driver's log
    )


def _stream_dag(dag_id: str, commit: str, *, deferrable: bool = False) -> DAG:
    """A manually triggered DAG of one stream task (run conf: the bounds)."""
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2025, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["eo", "example", "stream"],
        doc_md=__doc__,
        params=BOUNDS,
        default_args=DEFAULTS,
    ) as stream_dag:
        _stream(commit, deferrable=deferrable)
    return stream_dag


dag = _stream_dag("eo_stream", "inline")
detached_dag = _stream_dag("eo_stream_detached", "inline", deferrable=True)
prepare_dag = _stream_dag("eo_stream_prepare", "airflow")


# The watcher needs the pipeline's name and ledger at parse time: building the Pipeline
# reads only the environment (no connection, no I/O).
_pipeline = demo_pipeline()
prepared = Asset(
    f"eo_prepared_{_pipeline.name}",
    uri=f"eo://{_pipeline.name}/prepared",
    watchers=[
        AssetWatcher(
            name=f"eo_prepared_{_pipeline.name}",
            # With a ledger connection the triggerer looks the ledger up by its id: a
            # trigger's kwargs never carry a password (a password-free URL is accepted).
            trigger=EoPreparedCheckpointTrigger(
                pipeline=_pipeline.name,
                ledger_url=None if _pipeline.ledger_conn_id else _pipeline.ledger_url,
                ledger_conn_id=_pipeline.ledger_conn_id,
                poll_interval=2.0,
            ),
        )
    ],
)


@task
def lowest_prepared() -> int:
    """The lowest unfinished checkpoint when it is PREPARED; skips otherwise (nothing to
    commit yet, or an earlier checkpoint is still being prepared)."""
    from airflow_provider_eo.core.stream import unfinished_checkpoints
    from airflow_provider_eo.ledger import CheckpointState
    from airflow_provider_eo.operators.base import open_ledger, resolve_pipeline
    from airflow_provider_eo.version_compat import AirflowSkipException

    pipeline = resolve_pipeline(PIPELINE)
    with open_ledger(pipeline) as ledger:
        unfinished = unfinished_checkpoints(ledger, pipeline.name)
    if not unfinished or unfinished[0].state is not CheckpointState.PREPARED:
        raise AirflowSkipException(
            f"pipeline {pipeline.name!r}: no PREPARED checkpoint to commit"
            + (f" (lowest unfinished: {unfinished[0].checkpoint_id}, PLANNED)" if unfinished else "")
        )
    return unfinished[0].checkpoint_id


with DAG(
    dag_id="eo_stream_commit",
    schedule=[prepared],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["eo", "example", "stream"],
    doc_md=__doc__,
    default_args=DEFAULTS,
) as commit_dag:
    EoCommitOperator(
        task_id="commit",
        pipeline=PIPELINE,
        checkpoint_id=lowest_prepared(),
        outlets=[SINK],
    )
