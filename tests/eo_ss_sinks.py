"""A ``KafkaExactlyOnceSink`` built from the environment (``EO_SS_*``), for the Airflow test of
``EoQueryOperator``: the task imports it for the sink's name and ledger, the application
(tests/eo_ss_query.py with ``sink_ref``) for its query. Importing it starts nothing."""

from __future__ import annotations

import os

from airflow_provider_eo.streaming import KafkaExactlyOnceSink

SINK = KafkaExactlyOnceSink(
    name=os.environ.get("EO_SS_NAME", "ss-airflow"),
    kafka={"bootstrap.servers": os.environ.get("EO_SS_BOOTSTRAP", "127.0.0.1:9092")},
    sink_topic=os.environ.get("EO_SS_SINK", "ss-airflow-out"),
    ledger_url=os.environ.get("EO_SS_LEDGER_URL", "sqlite:///.eo/ss-ledger.db"),
    staging_dir=os.environ.get("EO_SS_STAGING", ".eo/staging"),
    commit_mode="local",
    commit_shards=2,
    heartbeat_s=1.0,
)
