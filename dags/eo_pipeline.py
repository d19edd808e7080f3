"""Example: an exactly-once Kafka -> PySpark -> Kafka pipeline, a run when there is data.

``plan >> prepare (spark-submit) >> wait (deferrable) >> commit``, from one call to
:func:`~airflow_provider_eo.task_group.eo_pipeline_group`. The pipeline itself
(``dags/eo_demo_pipelines.py``) reads the demo topic and writes an enriched one with
``airflow_provider_eo.examples.transforms:enrich``.

Scheduled on the source topic's asset, whose watcher (in the triggerer) fires when the
source holds stable records the ledger has not planned yet: an idle source runs nothing,
and each event is one run that plans what is there (the next event comes once that run has
planned, if records remain, e.g. after a capped checkpoint; or after ``refire_after`` when
a run failed before planning). See :mod:`airflow_provider_eo.triggers.source`.

Restart-from-checkpoint is a DAG retry: a retried or cleared task, or the next run,
continues the same unfinished checkpoint. ``max_active_runs=1`` keeps one run at a time.

Restore: trigger a run with ``{"restore_from": "<savepoint>"}`` (the ``restore_from``
field of the Trigger DAG form): its plan task restores the pipeline from that savepoint
(once, even if the task is retried) and plans from there. A stopped pipeline (``eo stop``
or a savepoint taken with "stop") makes every run skip, with the reason, until
``eo resume``.

Assets: each committed checkpoint is an event on the sink topic's asset
(``kafka://<bootstrap>/<sink topic>``); ``dags/eo_downstream.py`` runs on it. The asset is
built the same way in every DAG file that names it (``stream_commits=True``: its watcher
also announces what ``dags/eo_stream.py``'s streams commit), as Airflow requires of an
asset with a watcher.

Connections: ``spark_default`` (e.g. host ``local[2]``), optionally a ``kafka``
connection named by ``EO_KAFKA_CONN_ID`` and an ``eo_ledger`` one by ``EO_LEDGER_CONN_ID``
(the pipeline names them: see ``eo_demo_pipelines.py``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_provider_eo.assets import sink_asset, source_asset
from airflow_provider_eo.task_group import eo_pipeline_group

PIPELINE = "eo_demo_pipelines:demo_pipeline"
#: A run when the source holds records the ledger has not planned (its watcher polls every
#: EO_SOURCE_POLL_S seconds; after EO_SOURCE_REFIRE_S without a plan it fires again).
SOURCE = source_asset(
    PIPELINE,
    poll_interval=float(os.environ.get("EO_SOURCE_POLL_S", "5")),
    refire_after=float(os.environ.get("EO_SOURCE_REFIRE_S", "600")),
)

with DAG(
    dag_id="eo_pipeline",
    schedule=[SOURCE],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["eo", "example"],
    doc_md=__doc__,
    params={
        "restore_from": Param(
            None,
            type=["null", "string"],
            title="Restore from savepoint",
            description="Name of a savepoint to restore the pipeline from before this run plans "
            "(leave empty for a normal run).",
        ),
    },
) as dag:
    eo_pipeline_group(
        PIPELINE,
        group_id="eo",
        spark_conn_id=os.environ.get("EO_SPARK_CONN_ID", "spark_default"),
        # The Kafka connector as for any Spark job (else: the jars `eo setup jars` installed).
        prepare_kwargs={
            "packages": os.environ.get("EO_SPARK_PACKAGES") or None,
            "jars": os.environ.get("EO_SPARK_JARS") or None,
        },
        # The commit announces each checkpoint on the sink topic's asset (dags/eo_downstream.py).
        sink_asset=sink_asset(PIPELINE, stream_commits=True),
        poke_interval=5,
        timeout=30 * 60,
        retries=2,
        retry_delay=timedelta(seconds=float(os.environ.get("EO_RETRY_DELAY_S", "30"))),
    )
