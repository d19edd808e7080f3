"""The savepoint DAG triggered with Params, stop/resume seen by the pipeline DAG, and a
restore asked through the pipeline DAG's run conf: real Airflow 3 (``dag.test()`` with a
run conf, validated against the DAG's Params as the Trigger DAG form's), Kafka and
spark-submit."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.savepoint import resume_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

PLAN_ONLY = r"eo\.(prepare|wait|commit)"  # dag.test marks these success without running them


def test_savepoint_with_stop_then_resume_and_restore_from_run_conf(
    airflow_env: Any, kafka_bootstrap: str
) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_control_dags.py")
    pipeline = airflow_env.pipeline()
    produce_sample(kafka_bootstrap, pipeline.source_topics[0])  # 40 committed records, 25 a checkpoint

    # 1. A pipeline run whose commit does not run: checkpoint 1 is left PREPARED.
    (first,) = airflow_env.run_dag_test("eo_pipeline", mark_success=r"eo\.commit")
    assert first["xcoms"]["eo.plan"]["checkpoint_id"] == 1, first
    with Ledger(pipeline.ledger_url) as ledger:
        assert ledger.get(pipeline.name, 1).state is CheckpointState.PREPARED

    # 2. The savepoint DAG, triggered with the form's Params (stop=true), waits for it.
    conf = {
        "pipeline": "eo_demo_pipelines:demo_pipeline",
        "name": "before-upgrade",
        "note": "nightly",
        "stop": True,
        "wait_seconds": 300,
    }
    outcome: dict[str, Any] = {}

    def trigger() -> None:
        try:
            outcome["runs"] = airflow_env.run_dag_test(
                "eo_control_dags", dag_attr="savepoint_dag", conf=json.dumps(conf)
            )
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=trigger, daemon=True)
    thread.start()
    with Ledger(pipeline.ledger_url) as ledger:
        # The stop is recorded first, while checkpoint 1 is still in flight.
        wait_for(
            lambda: ledger.get_pipeline(pipeline.name).stopped or not thread.is_alive(),
            "the savepoint task to stop the pipeline",
            timeout=240,
        )
        assert "error" not in outcome and thread.is_alive(), outcome
        assert ledger.list_savepoints(pipeline.name) == []  # not before checkpoint 1 commits
        assert ledger.get(pipeline.name, 1).state is CheckpointState.PREPARED
        commit_checkpoint(pipeline, ledger, 1)
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in outcome, outcome
    (sp_run,) = outcome["runs"]
    assert sp_run["state"] == "success", sp_run
    summary = sp_run["xcoms"]["savepoint"]
    assert summary["name"] == "before-upgrade" and summary["checkpoint_id"] == 1, summary
    assert summary["note"] == "nightly"
    # The savepoint records the triggering run (dag.test's triggering user is "dag_test").
    assert summary["created_by"] == f"airflow:eo_savepoint/{sp_run['run_id']} by dag_test", summary
    assert (summary["dag_id"], summary["run_id"]) == ("eo_savepoint", sp_run["run_id"])
    with Ledger(pipeline.ledger_url) as ledger:
        cp1 = ledger.get(pipeline.name, 1)
        sp = ledger.get_savepoint(pipeline.name, "before-upgrade")
    ends: dict[str, dict[int, int]] = {}
    for r in cp1.ranges:
        ends.setdefault(r.topic, {})[r.partition] = r.end
    assert {t: dict(p) for t, p in sp.offsets.items()} == ends

    # 3. Stopped: the pipeline DAG's next run skips (with the reason) and plans nothing.
    (stopped,) = airflow_env.run_dag_test("eo_pipeline")
    assert stopped["tis"]["eo.plan"]["state"] == "skipped", stopped
    assert all(ti["state"] == "skipped" for ti in stopped["tis"].values()), stopped
    assert "stop with savepoint 'before-upgrade'" in airflow_env.log_text()
    with Ledger(pipeline.ledger_url) as ledger:
        assert [c.checkpoint_id for c in ledger.list_checkpoints(pipeline.name)] == [1]
        resume_pipeline(pipeline, ledger)

    # 4. Resumed: a run commits checkpoint 2 (it starts where the savepoint points).
    (resumed,) = airflow_env.run_dag_test("eo_pipeline")
    assert resumed["state"] == "success" and resumed["xcoms"]["eo.commit"]["state"] == "COMMITTED", resumed

    # 5. A run with {"restore_from": ...}: the plan restores, then fails after its work on
    #    try 1; the retry does not restore again and plans from the savepoint's offsets,
    #    so checkpoint 2's range is read again.
    (restored,) = airflow_env.run_dag_test(
        "eo_pipeline",
        conf=json.dumps({"restore_from": "before-upgrade"}),
        plan_fault_runs="1",
        mark_success=PLAN_ONLY,
    )
    assert restored["tis"]["eo.plan"]["try_number"] == 2, restored
    plan = restored["xcoms"]["eo.plan"]
    assert plan["restored"]["repeated"] is True, plan  # the retry's view: done by try 1
    with Ledger(pipeline.ledger_url) as ledger:
        cps = ledger.list_checkpoints(pipeline.name)
        restores = [e for e in ledger.events(pipeline.name) if e.kind == "restore"]
    assert len(restores) == 1, restores
    assert restores[0].details["request_key"] == f"eo_pipeline/{restored['run_id']}"
    assert restores[0].run_id == restored["run_id"] and restores[0].dag_id == "eo_pipeline"
    cp2, cp3 = cps[1], cps[2]
    assert cp3.checkpoint_id == plan["checkpoint_id"] == 3
    assert sorted((r.topic, r.partition, r.start) for r in cp3.ranges if r.end > r.start) == sorted(
        (r.topic, r.partition, r.start) for r in cp2.ranges if r.end > r.start
    )
