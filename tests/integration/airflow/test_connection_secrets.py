"""Connections are enough, and their secrets stay secret.

The example pipeline names its Kafka cluster and its ledger only by Airflow connection
(``Pipeline(kafka_conn_id=..., ledger_conn_id=...)``: no bootstrap server or URL in code);
both connections carry a password. A real ``dag.test()`` run plans, prepares (spark-submit,
client mode, a real Spark driver with its UI on) and commits, exactly once against the
source. While it runs, every process's command line and environment (``ps``) and the
Spark driver's REST environment endpoint are sampled; afterwards the Spark event log, the
XComs and every task log are read. Neither password appears anywhere.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.connections import ConnectionSettings, apply_settings
from airflow_provider_eo.ledger import CheckpointState, Ledger

VENV_BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.timeout(900),
]

DAG_SOURCE = '''
"""The example pipeline with the Spark event log on (the test reads it)."""
import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

with DAG(dag_id="eo_secrets", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    eo_pipeline_group(
        "eo_demo_pipelines:demo_pipeline",
        group_id="eo",
        spark_conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.compress": "false",
            "spark.eventLog.dir": os.environ["EO_TEST_EVENT_LOG_DIR"],
            "spark.ui.port": os.environ["EO_TEST_UI_PORT"],
        },
        prepare_kwargs={"jars": os.environ.get("EO_SPARK_JARS") or None},
        poke_interval=2,
        retries=0,
    )
'''


class Sampler(threading.Thread):
    """Every 0.1 s until stopped: every process's arguments and environment (``ps -eww e``)
    and, when the Spark driver's UI answers, its REST environment endpoint."""

    def __init__(self, ui_port: int) -> None:
        super().__init__(daemon=True)
        self.ui_port = ui_port
        self.stop = threading.Event()
        self.ps: set[str] = set()
        self.rest: list[str] = []
        self.samples = 0

    def _rest(self) -> None:
        base = f"http://127.0.0.1:{self.ui_port}/api/v1/applications"
        try:
            with urllib.request.urlopen(base, timeout=1) as r:
                apps = json.loads(r.read())
            for app in apps:
                with urllib.request.urlopen(f"{base}/{app['id']}/environment", timeout=2) as r:
                    self.rest.append(r.read().decode())
        except (OSError, ValueError):
            pass

    def run(self) -> None:
        while not self.stop.wait(0.1):
            out = subprocess.run(["ps", "-eww", "e", "-o", "pid=,args="], capture_output=True, text=True)
            self.ps.update(out.stdout.splitlines())
            self.samples += 1
            self._rest()


def test_connections_alone_configure_the_pipeline_and_no_secret_leaks(
    airflow_env: Any, kafka_bootstrap: str, pg_fresh_url: str, tmp_path: Path
) -> None:
    from eo_source_sink import assert_sink_is_source_exactly_once
    from sqlalchemy.engine import make_url

    from airflow_provider_eo.demo.sample import produce_sample

    kafka_secret = f"eo-kafka-secret-{uuid.uuid4().hex[:10]}"
    ledger_secret = f"eo-ledger-secret-{uuid.uuid4().hex[:10]}"
    server = make_url(pg_fresh_url)
    # Trust auth on the test server and a PLAINTEXT broker: the passwords are canaries that
    # every client still receives (librdkafka, Spark's Java client, psycopg).
    ledger_conn = json.dumps(
        {
            "conn_type": "postgres",
            "host": server.host,
            "port": server.port,
            "schema": server.database,
            "login": server.username,
            "password": ledger_secret,
        }
    )
    kafka_conn = json.dumps(
        {
            "conn_type": "kafka",
            "extra": {
                "bootstrap.servers": kafka_bootstrap,
                "sasl.username": "eo",
                "sasl.password": kafka_secret,
            },
        }
    )
    # In the metadata database, as a deployment keeps them (an AIRFLOW_CONN_* variable would
    # put the password in every Airflow process's environment by the user's own choice).
    for conn_id, doc in (("eo_secret_kafka", kafka_conn), ("eo_secret_ledger", ledger_conn)):
        subprocess.run(
            [str(VENV_BIN / "airflow"), "connections", "add", conn_id, "--conn-json", doc],
            env=airflow_env.env,
            check=True,
            capture_output=True,
            timeout=120,
        )
    airflow_env.env["EO_KAFKA_CONN_ID"] = "eo_secret_kafka"
    airflow_env.env["EO_LEDGER_CONN_ID"] = "eo_secret_ledger"
    airflow_env.env.pop("EO_KAFKA_BOOTSTRAP")  # connections are enough: no endpoint in code
    airflow_env.env["EO_DEMO_MAX_RECORDS"] = "100000"  # one checkpoint takes the whole sample
    events = tmp_path / "spark-events"
    events.mkdir()
    airflow_env.env["EO_TEST_EVENT_LOG_DIR"] = f"file://{events}"
    (airflow_env.dags / "eo_secrets.py").write_text(DAG_SOURCE)

    pipeline = airflow_env.pipeline()
    assert pipeline.connection_ids and "bootstrap.servers" not in pipeline.kafka
    ledger_url = server.set(password=ledger_secret).render_as_string(hide_password=False)
    resolved = apply_settings(
        pipeline,
        ConnectionSettings(
            kafka_conn_id="eo_secret_kafka",
            kafka={"bootstrap.servers": kafka_bootstrap},
            ledger_conn_id="eo_secret_ledger",
            ledger_url=ledger_url,
        ),
    )
    produced, _aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    with socket.socket() as probe:  # a free port for the driver's UI (the sampler polls it)
        probe.bind(("127.0.0.1", 0))
        ui_port = probe.getsockname()[1]
    airflow_env.env["EO_TEST_UI_PORT"] = str(ui_port)
    sampler = Sampler(ui_port)
    sampler.start()
    try:
        (run,) = airflow_env.run_dag_test("eo_secrets", runs=1)
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)

    assert run["state"] == "success", run
    with Ledger(ledger_url) as ledger:
        checkpoints = ledger.list_checkpoints(pipeline.name)
        assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED] * len(checkpoints)
        assert checkpoints
    assert_sink_is_source_exactly_once(dict(resolved.kafka), resolved, source_records=produced)
    assert sum(c.records for c in checkpoints) == produced

    # The samplers saw the run: the spark-submit driver and its REST environment.
    assert sampler.samples > 10
    assert any("prepare.py" in line for line in sampler.ps), "no spark-submit seen by ps"
    assert sampler.rest, "the prepare driver's REST environment endpoint never answered"
    event_logs = [p for p in events.rglob("*") if p.is_file()]
    assert event_logs, "no Spark event log written"
    places = {
        "ps (arguments and environment)": "\n".join(sampler.ps),
        "the driver's REST environment": "\n".join(sampler.rest),
        "the Spark event log": "\n".join(p.read_text(errors="replace") for p in event_logs),
        "XCom": json.dumps(run),
        "task logs": airflow_env.log_text()
        + "".join(
            p.read_text(errors="replace") for p in (airflow_env.home / "logs").rglob("*") if p.is_file()
        ),
    }
    for where, text in places.items():
        for secret in (kafka_secret, ledger_secret):
            assert secret not in text, f"a password leaked into {where}"
