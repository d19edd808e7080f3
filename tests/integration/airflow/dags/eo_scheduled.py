"""The scheduler test's DAG: the example pipeline every 20 seconds, and a sensor that
always goes through the triggerer (check_before_defer=False) so the deferral is real."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

with DAG(
    dag_id="eo_scheduled",
    schedule=timedelta(seconds=20),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
) as dag:
    eo_pipeline_group(
        "eo_demo_pipelines:demo_pipeline",
        group_id="eo",
        poke_interval=1,
        timeout=300,
        retries=1,
        retry_delay=timedelta(seconds=2),
        wait_kwargs={"check_before_defer": False},
    )
