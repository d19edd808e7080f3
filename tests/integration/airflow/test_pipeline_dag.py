"""The example DAG under ``dag.test()``: real Airflow 3, real Kafka, real spark-submit."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]


def _audit_clean(pipeline: Any) -> list[Any]:
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
        checkpoints = ledger.list_checkpoints(pipeline.name)
    assert report.ok, report.as_dict()
    assert report.duplicates == 0 and report.missing == 0
    return checkpoints


def test_three_runs_commit_exactly_once_through_a_commit_and_a_prepare_retry(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    """Three runs of the example DAG, one spark-submit each (and one for the retried prepare):

    - run 1's commit dies after the Kafka commit (before the ledger update): its retry finds
      the commit markers and sends nothing;
    - run 2's prepare job dies after writing its staged files: the retry prepares the very
      checkpoint and ranges the plan recorded, once;
    - run 3 is clean (every task on its first try).

    Every task is retried only where a fault was injected; three checkpoints commit, in the
    ledger with their Airflow lineage and extra links; every committed source record is in
    the sink exactly once: none lost, none twice, nothing of the aborted input."""
    pipeline = airflow_env.pipeline()
    committed, aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    runs = airflow_env.run_dag_test("eo_pipeline", runs=3, commit_fault_runs="1", prepare_fault_runs="2")

    first, second, third = runs
    for run in runs:
        assert run["state"] == "success", run
        assert run["xcoms"]["eo.commit"]["state"] == "COMMITTED", run
    retried = {1: "eo.commit", 2: "eo.prepare", 3: None}
    for run in runs:
        tries = {task: ti["try_number"] for task, ti in run["tis"].items()}
        expected = {task: 2 if task == retried[run["run"]] else 1 for task in tries}
        assert tries == expected, run
    log = airflow_env.log_text()
    assert "injected fault at commit.after_commit_txn" in log
    assert "injected fault at prepare.after_write" in log
    # Run 1: try 1 published and died before the ledger update; the retry found the commit
    # marker and sent nothing.
    assert first["xcoms"]["eo.commit"]["published"] == 0, first
    assert first["xcoms"]["eo.commit"]["shards_skipped"] >= 1, first
    assert [r["xcoms"]["eo.plan"]["checkpoint_id"] for r in runs] == [1, 2, 3]
    checkpoints = _audit_clean(pipeline)
    assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED] * 3
    assert sum(c.records or 0 for c in checkpoints) == committed
    # Counted against the source, by the source position each output carries.
    report = assert_sink_is_source_exactly_once(pipeline.kafka, pipeline, source_records=committed)
    assert report.sink == committed == 40 and aborted == 20, report.describe()
    # Airflow lineage in the ledger: each checkpoint names the run that planned it.
    assert [c.run_id for c in checkpoints] == [r["run_id"] for r in runs]
    # Runs 2 and 3 published what their checkpoints hold (run 1's try 1 published its own).
    assert [r["xcoms"]["eo.commit"]["published"] for r in (second, third)] == [
        c.records for c in checkpoints[1:]
    ]
    # Run 2: the retry prepared the very checkpoint and ranges the plan recorded, once.
    cp = checkpoints[1]
    assert [r.compact() for r in cp.ranges] == second["xcoms"]["eo.plan"]["ranges"]
    with Ledger(pipeline.ledger_url) as ledger:
        events = ledger.events(pipeline.name, cp.checkpoint_id)
    prepared = [e for e in events if e.to_state is CheckpointState.PREPARED]
    assert len(prepared) == 1 and prepared[0].try_number == 2 and prepared[0].task_id == "eo.prepare"
    # The plan and commit tasks' "Checkpoint" extra link: the UI page, on their checkpoint.
    for n, run in enumerate(runs, start=1):
        for task in ("eo.plan", "eo.commit"):
            link = run["links"][f"{task}_link_EoCheckpointLink"]
            assert link.endswith(f"/eo/?pipeline={pipeline.name}&checkpoint={n}"), (task, link)


def test_plan_preflight_fails_the_run_naming_the_missing_sink(airflow_env: Any, kafka_bootstrap: str) -> None:
    """The plan task runs the doctor's Kafka and ledger checks first: a missing sink topic
    fails it with what to change, before anything is planned or read."""
    missing = f"no-such-sink-{airflow_env.env['EO_DEMO_PIPELINE']}"
    airflow_env.env["EO_DEMO_SINK_TOPIC"] = missing
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_pipeline", runs=1)

    assert run["state"] == "failed", run
    assert run["tis"]["eo.plan"]["state"] == "failed", run
    log = airflow_env.log_text()
    assert f"pipeline {pipeline.name!r}: preflight failed, nothing was planned" in log
    assert f"sink topic {missing!r} does not exist" in log and "kafka-topics --create" in log
    with Ledger(pipeline.ledger_url) as ledger:
        assert pipeline.name not in [p.name for p in ledger.list_pipelines()]


@pytest.mark.postgres
def test_postgres_connection_as_ledger_and_its_password_never_shows(
    airflow_env: Any, kafka_bootstrap: str, pg_fresh_url: str
) -> None:
    """An existing ``postgres`` (common-sql) connection is the ledger (``ledger_conn_id``);
    its password is masked in every task log, absent from XComs and from the trigger's
    stored kwargs (the sensor's trigger carries the connection id)."""
    from sqlalchemy.engine import make_url

    secret = f"eo-secret-{uuid.uuid4().hex[:10]}"
    server = make_url(pg_fresh_url)
    db = server.database
    # Trust auth on the test server: any password is accepted, so it can be a canary.
    fields = {
        "conn_type": "postgres",
        "host": server.host,
        "port": server.port,
        "schema": db,
        "login": server.username,
        "password": secret,
    }
    airflow_env.env["AIRFLOW_CONN_EO_PG_LEDGER"] = json.dumps(fields)
    airflow_env.env["EO_LEDGER_CONN_ID"] = "eo_pg_ledger"
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_pipeline", runs=1)

    assert run["state"] == "success", run
    assert run["xcoms"]["eo.commit"]["state"] == "COMMITTED", run
    url = server.set(database=db, password=secret).render_as_string(hide_password=False)
    with Ledger(url) as ledger:
        (cp,) = ledger.list_checkpoints(pipeline.name)
    assert cp.state is CheckpointState.COMMITTED
    assert cp.records == run["xcoms"]["eo.commit"]["published"] > 0
    logs = airflow_env.log_text() + "".join(
        p.read_text(errors="replace") for p in (airflow_env.home / "logs").rglob("*") if p.is_file()
    )
    assert secret not in logs and secret not in json.dumps(run)
