"""The user's Spark settings reach the prepare job: ``EoSubmitOperator(conf=...)`` (here
through ``eo_pipeline_group(spark_conf=...)``) is spark-submit's ``--conf``, and eo's
local defaults (4 shuffle partitions, no UI) never override it. Read from the job's own
Spark event log (its environment section), not from what eo says it set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.names import PREPARE_APP

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

DAG_SOURCE = '''
"""The example pipeline DAG with the team's own Spark settings for the prepare."""
import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

with DAG(dag_id="eo_spark_settings", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    eo_pipeline_group(
        "eo_demo_pipelines:demo_pipeline",
        group_id="eo",
        spark_conf={
            "spark.sql.shuffle.partitions": "37",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.compress": "false",
            "spark.eventLog.dir": os.environ["EO_TEST_EVENT_LOG_DIR"],
        },
        prepare_kwargs={"jars": os.environ.get("EO_SPARK_JARS") or None},
        poke_interval=2,
        retries=0,
    )
'''


def _spark_properties(event_log: Path) -> dict[str, str]:
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("Event") == "SparkListenerEnvironmentUpdate":
            return dict(event["Spark Properties"])
    raise AssertionError(f"no environment update in {event_log}")


def test_the_operators_spark_conf_wins_and_the_ui_stays_on(airflow_env: Any, tmp_path: Path) -> None:
    from airflow_provider_eo.demo.sample import produce_sample

    events = tmp_path / "spark-events"
    events.mkdir()
    (airflow_env.dags / "eo_spark_settings.py").write_text(DAG_SOURCE)
    airflow_env.env["EO_TEST_EVENT_LOG_DIR"] = f"file://{events}"
    pipeline = airflow_env.pipeline()
    produce_sample(airflow_env.env["EO_KAFKA_BOOTSTRAP"], pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_spark_settings", runs=1)

    assert run["state"] == "success", run
    with Ledger(pipeline.ledger_url) as ledger:
        assert [c.state for c in ledger.list_checkpoints(pipeline.name)] == [CheckpointState.COMMITTED]
    logs = [p for p in events.rglob("*") if p.is_file() and p.name.startswith(("events_", "local-"))]
    assert logs, "the prepare job wrote no event log"
    props = [_spark_properties(p) for p in logs]
    prepare = [p for p in props if p.get("spark.app.name", "").startswith(PREPARE_APP)]
    assert prepare, [p.get("spark.app.name") for p in props]
    for p in prepare:
        assert p["spark.sql.shuffle.partitions"] == "37", p
        assert p.get("spark.ui.enabled", "true") == "true", p  # on, as the user left it
        assert p["spark.sql.session.timeZone"] == "UTC"
