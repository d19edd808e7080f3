"""The example pipeline of ``dags/eo_pipeline.py``: demo events in, enriched events out.

Everything comes from the environment so the same DAG runs against the local stack,
a test broker or a real cluster:

- ``EO_KAFKA_CONN_ID``: an Airflow ``kafka`` connection holding the cluster's settings
  (bootstrap servers, credentials); read by every process that needs it at run time.
- ``EO_KAFKA_BOOTSTRAP``: bootstrap servers in code instead (default ``127.0.0.1:9092``
  when no connection is named); a connection's settings win over them. The example DAGs'
  assets (``kafka://<server>/<topic>``) are named while the DAG files are parsed, when no
  connection is read: with a connection, still set this to a server of the same cluster
  (any one, the same in every DAG file), or the DAG files refuse to load and say so.
- ``EO_DEMO_PIPELINE``, ``EO_DEMO_SOURCE_TOPIC``, ``EO_DEMO_SINK_TOPIC``: names.
- ``EO_LEDGER_CONN_ID``: an ``eo_ledger`` or ``postgres`` connection as the ledger; else
  ``EO_LEDGER_URL`` (default: a SQLite file in the project's ``.eo`` folder).
- ``EO_STAGING_DIR``: where prepared output waits for its commit (default ``.eo/staging``).
- ``EO_DEMO_MAX_RECORDS``: offsets per checkpoint (default 1000).
- ``EO_DEMO_TRANSFORM``: the transform, ``module:function`` (default the example
  ``airflow_provider_eo.examples.transforms:enrich``); a module next to the DAGs is shipped
  to the Spark executors by the prepare task (``py_files``).

Loaded by the tasks at run time (``"eo_demo_pipelines:demo_pipeline"``); the example DAG
files also build it while they are parsed, to name its topics' assets (that reads only the
environment: no connection, no I/O).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from airflow_provider_eo.pipeline import Pipeline


def _state_dir() -> str:
    from airflow_provider_eo.stack.paths import state_dir

    return str(state_dir())


def demo_pipeline(env: Mapping[str, str] | None = None) -> Pipeline:
    """The demo pipeline, configured from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    ledger_url = env.get("EO_LEDGER_URL") or f"sqlite:///{_state_dir()}/airflow-ledger.db"
    staging_dir = env.get("EO_STAGING_DIR") or os.path.join(_state_dir(), "airflow-staging")
    kafka_conn_id = env.get("EO_KAFKA_CONN_ID") or None
    bootstrap = env.get("EO_KAFKA_BOOTSTRAP") or (None if kafka_conn_id else "127.0.0.1:9092")
    return Pipeline(
        name=env.get("EO_DEMO_PIPELINE", "eo-demo"),
        kafka={"bootstrap.servers": bootstrap} if bootstrap else {},
        kafka_conn_id=kafka_conn_id,
        ledger_conn_id=env.get("EO_LEDGER_CONN_ID") or None,
        source_topics=[env.get("EO_DEMO_SOURCE_TOPIC", "eo-demo-events")],
        sink_topic=env.get("EO_DEMO_SINK_TOPIC", "eo-demo-enriched"),
        transform=env.get("EO_DEMO_TRANSFORM") or "airflow_provider_eo.examples.transforms:enrich",
        ledger_url=ledger_url,
        staging_dir=staging_dir,
        max_records_per_checkpoint=int(env.get("EO_DEMO_MAX_RECORDS", "1000")),
        spark_conf={"spark.sql.shuffle.partitions": "2"},
    )
