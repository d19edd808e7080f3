"""One Airflow ``kafka`` connection to a SASL_SSL + SCRAM-SHA-512 broker carries the whole
pipeline: the plan's admin calls, Spark's source read (the Java client, from the translated
settings), the commit's transactions and the audit. Connections are enough, and their
secrets stay secret: the pipeline names its cluster and its ledger (PostgreSQL) by
connection only, both connections carry a password, and while the example DAG runs every
process's command line and environment (``ps``) and the Spark driver's REST environment
endpoint are sampled; afterwards the Spark event log, the XComs and every task log are
read. Neither password appears anywhere.

The module starts its own broker (self-signed CA made here, SCRAM users created when its
storage is formatted) on 127.0.0.1 and stops it at the end; ``kafka_bootstrap`` and
``kafka_config`` are overridden for this module, so the Airflow fixtures create their topics
there. The pipeline's own ``bootstrap.servers`` points at a port nothing listens on: a client
that did not go through the connection would find no cluster.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eo_source_sink import assert_sink_is_source_exactly_once
from eo_tls import issue, make_ca

from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.stack.kafka import ListenerSecurity, LocalKafka, free_port

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

VENV_BIN = Path(sys.executable).parent

CONN_ID = "eo_secure_kafka"
MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SecureBroker:
    """The module's SASL_SSL broker and the SCRAM user the pipeline logs in as."""

    bootstrap: str
    ca: Path
    user: str
    password: str

    def config(self, **changes: str) -> dict[str, Any]:
        """librdkafka settings of the pipeline's user (``changes`` applied)."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": self.user,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.ca),
            **changes,
        }

    def connection(self, **changes: str) -> str:
        """The ``AIRFLOW_CONN_<ID>`` value (JSON form) of an apache-kafka ``kafka`` connection;
        its ``group.id`` is for other consumers and is dropped by eo."""
        return json.dumps({"conn_type": "kafka", "extra": {**self.config(**changes), "group.id": "others"}})


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A SASL_SSL (SCRAM-SHA-512) broker with a CA of its own, for this module."""
    from airflow_provider_eo.kafka.admin import close_shared_clients
    from airflow_provider_eo.kafka.publisher import close_producers

    folder = tmp_path_factory.mktemp("sasl-ssl")
    ca = make_ca(folder)
    server = issue(ca, folder, "broker", server=True)
    key_store = folder / "broker-key-store.pem"
    key_store.write_text(server.key.read_text() + server.cert.read_text())
    password = secrets.token_urlsafe(16)
    users = {"eo-broker": secrets.token_urlsafe(16), "eo": password}
    kafka = LocalKafka(
        home=folder / "kafka",
        security=ListenerSecurity(key_store=key_store, ca=ca.cert, users=users, mechanism=MECHANISM),
    )
    info = kafka.up(timeout_s=120)
    try:
        yield SecureBroker(bootstrap=info.bootstrap, ca=ca.cert, user="eo", password=password)
    finally:
        close_shared_clients()  # while the broker still answers (see tests/conftest.py)
        close_producers()  # the transactional producers local commits kept, likewise
        kafka.wipe()


@pytest.fixture(scope="module")
def kafka_bootstrap(secure_broker: SecureBroker) -> str:
    """This module's broker instead of the session's plaintext one."""
    return secure_broker.bootstrap


@pytest.fixture(scope="module")
def kafka_config(secure_broker: SecureBroker) -> dict[str, Any]:
    """Client settings for this module's broker (``make_topic`` creates topics with them)."""
    return secure_broker.config()


DAG_SOURCE = '''
"""The example pipeline with the Spark event log and UI on (the test reads them)."""
import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

with DAG(dag_id="eo_secure", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
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


def _add_connection(airflow_env: Any, conn_id: str, doc: str) -> None:
    """In the metadata database, as a deployment keeps connections (an AIRFLOW_CONN_*
    variable would put the password in every Airflow process's environment by the user's
    own choice)."""
    subprocess.run(
        [str(VENV_BIN / "airflow"), "connections", "add", conn_id, "--conn-json", doc],
        env=airflow_env.env,
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.postgres
def test_pipeline_runs_through_connections_alone_and_no_secret_leaks(
    airflow_env: Any,
    secure_broker: SecureBroker,
    pg_fresh_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy.engine import make_url

    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.hooks.base import resolve_connections
    from airflow_provider_eo.ledger import CheckpointState, Ledger

    connection = secure_broker.connection()
    ledger_secret = f"eo-ledger-secret-{uuid.uuid4().hex[:10]}"
    server = make_url(pg_fresh_url)
    # Trust auth on the test server: the ledger password is a canary psycopg still receives.
    ledger_conn = {
        "conn_type": "postgres",
        "host": server.host,
        "port": server.port,
        "schema": server.database,
        "login": server.username,
        "password": ledger_secret,
    }
    _add_connection(airflow_env, CONN_ID, connection)
    _add_connection(airflow_env, "eo_secure_ledger", json.dumps(ledger_conn))
    airflow_env.env["EO_KAFKA_BOOTSTRAP"] = f"127.0.0.1:{free_port()}"  # nothing there
    airflow_env.env["EO_DEMO_MAX_RECORDS"] = "1000"  # one checkpoint takes the whole input
    # The example pipeline reads EO_KAFKA_CONN_ID / EO_LEDGER_CONN_ID into
    # Pipeline(kafka_conn_id=..., ledger_conn_id=...): every process (the tasks, the Spark
    # driver) takes its settings from the connections.
    airflow_env.env["EO_KAFKA_CONN_ID"] = CONN_ID
    airflow_env.env["EO_LEDGER_CONN_ID"] = "eo_secure_ledger"
    events = tmp_path / "spark-events"
    events.mkdir()
    airflow_env.env["EO_TEST_EVENT_LOG_DIR"] = f"file://{events}"
    with socket.socket() as probe:  # a free port for the driver's UI (the sampler polls it)
        probe.bind(("127.0.0.1", 0))
        ui_port = probe.getsockname()[1]
    airflow_env.env["EO_TEST_UI_PORT"] = str(ui_port)
    (airflow_env.dags / "eo_secure.py").write_text(DAG_SOURCE)
    committed, _aborted = produce_sample(
        secure_broker.bootstrap, airflow_env.env["EO_DEMO_SOURCE_TOPIC"], client_config=secure_broker.config()
    )

    sampler = Sampler(ui_port)
    sampler.start()
    try:
        (run,) = airflow_env.run_dag_test("eo_secure", runs=1)
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)

    assert run["state"] == "success", run
    assert run["xcoms"]["eo.commit"]["state"] == "COMMITTED", run
    assert run["xcoms"]["eo.commit"]["published"] == committed == 40, run
    # The audit and the exactly-once count read through the same connections, here.
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection)
    monkeypatch.setenv("AIRFLOW_CONN_EO_SECURE_LEDGER", json.dumps(ledger_conn))
    pipeline, _ = resolve_connections(airflow_env.pipeline())
    assert pipeline.kafka["bootstrap.servers"] == secure_broker.bootstrap
    assert "group.id" not in pipeline.kafka
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
        (checkpoint,) = ledger.list_checkpoints(pipeline.name)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
    assert checkpoint.state is CheckpointState.COMMITTED and checkpoint.records == committed
    assert_sink_is_source_exactly_once(dict(pipeline.kafka), pipeline, source_records=committed)

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
        for secret in (secure_broker.password, ledger_secret):
            assert secret not in text, f"a password leaked into {where}"


def test_a_wrong_password_is_an_authentication_error_at_once(
    secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_eo.hooks.kafka import EoKafkaHook
    from airflow_provider_eo.kafka.login import KafkaLoginRefused, check_login

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", secure_broker.connection(**{"sasl.password": "wrong"})
    )
    hook = EoKafkaHook(kafka_config_id=CONN_ID)
    started = time.monotonic()
    ok, message = hook.test_connection()
    assert not ok
    assert time.monotonic() - started < 10, "a refused login must not wait for a time-out"
    assert message.startswith(
        f"connection {CONN_ID!r}: Kafka at {secure_broker.bootstrap!r} refused the login"
    )
    assert f"user 'eo' ({MECHANISM})" in message and "invalid credentials" in message, message
    with pytest.raises(KafkaLoginRefused, match=r"check sasl\.username/sasl\.password"):
        check_login(hook.get_config(), owner=f"connection {CONN_ID!r}")

    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", secure_broker.connection())
    assert EoKafkaHook(kafka_config_id=CONN_ID).test_connection() == (True, "connected: 1 broker(s)")


def test_spark_reads_with_the_translated_settings_and_a_wrong_password_fails_at_once(
    spark: Any, secure_broker: SecureBroker, make_topic: Any
) -> None:
    """Spark's Java client: the translated SASL_SSL settings read the committed records; a
    wrong password fails the read with the broker's authentication error, not a time-out."""
    from airflow_provider_eo.kafka.client_config import java_client_options

    topic = make_topic("sasl-java", 3)
    committed, _aborted = produce_sample(secure_broker.bootstrap, topic, client_config=secure_broker.config())

    def read(config: dict[str, Any]) -> int:
        options = {**java_client_options(config), "kafka.isolation.level": "read_committed"}
        return int(spark.read.format("kafka").options(**options).option("subscribe", topic).load().count())

    assert read(secure_broker.config()) == committed
    started = time.monotonic()
    with pytest.raises(Exception, match=r"SaslAuthenticationException.*invalid credentials.*SCRAM-SHA-512"):
        read(secure_broker.config(**{"sasl.password": "wrong"}))
    assert time.monotonic() - started < 60, "a refused login must not wait for a time-out"
