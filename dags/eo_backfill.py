"""Backfill the example pipeline one day at a time, from the offsets in its ledger.

Each run re-processes its own data interval ``[data_interval_start, data_interval_end)``:
the source records whose Kafka timestamp falls in that day and that the live pipeline
has COMMITTED, with the pipeline's transform, into a separate backfill sink topic
(``EO_BACKFILL_SINK_TOPIC``, default ``<demo sink>.backfill``; the ``sink_topic`` Param
of a manual run overrides it). The backfill is checkpointed and committed exactly once
under its own identity: a retry resumes it, and re-running an interval adds nothing.

``catchup=True`` runs every day since ``start_date`` (``EO_BACKFILL_START``, default
2025-01-01); re-process history with

    airflow backfill create --dag-id eo_backfill --from-date 2025-01-01 --to-date 2025-01-07

``max_active_runs=1``: one interval at a time.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, Param

from airflow_provider_eo.operators.backfill import EoBackfillOperator

# Airflow's own timetable (in airflow.sdk from Airflow 3.2 on, elsewhere on 3.1).
from airflow_provider_eo.version_compat import CronDataIntervalTimetable

SINK_TOPIC = os.environ.get("EO_BACKFILL_SINK_TOPIC") or (
    os.environ.get("EO_DEMO_SINK_TOPIC", "eo-demo-enriched") + ".backfill"
)
START = datetime.fromisoformat(os.environ.get("EO_BACKFILL_START", "2025-01-01")).replace(tzinfo=timezone.utc)

with DAG(
    dag_id="eo_backfill",
    # A data-interval timetable: each run covers the day before it ("@daily" alone is a
    # trigger timetable on Airflow 3, whose interval is empty).
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=START,
    catchup=True,
    max_active_runs=1,
    tags=["eo", "example", "backfill"],
    doc_md=__doc__,
    params={
        "sink_topic": Param(
            SINK_TOPIC,
            type="string",
            minLength=1,
            title="Backfill sink topic",
            description="Where the re-processed records go (never the live sink).",
        ),
    },
) as dag:
    EoBackfillOperator(
        task_id="backfill",
        pipeline="eo_demo_pipelines:demo_pipeline",
        sink_topic="{{ params.sink_topic }}",
        conn_id=os.environ.get("EO_SPARK_CONN_ID", "spark_default"),
        retries=2,
        retry_delay=timedelta(seconds=float(os.environ.get("EO_RETRY_DELAY_S", "30"))),
    )
