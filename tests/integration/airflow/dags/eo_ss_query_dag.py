"""A Structured Streaming application writing through ``KafkaExactlyOnceSink``, run by
``EoQueryOperator`` (the Airflow test of the operator sets ``EO_SS_*``)."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_eo.operators.query import EoQueryOperator

with DAG("eo_ss_query", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    EoQueryOperator(
        task_id="query",
        sink="eo_ss_sinks:SINK",
        application=os.environ.get("EO_SS_APP", "eo_ss_query.py"),
        application_args=[os.environ.get("EO_SS_SPEC", "{}")],
    )
