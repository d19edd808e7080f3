"""EoCommitOperator(commit_mode="spark") under ``dag.test()``: real Airflow 3, Kafka and
spark-submit (local master). The commit task spark-submits the commit application; every
shard is published by a Spark task's Python worker, none by the Airflow task process; and
when the Airflow task process is SIGKILLed (with its spark-submit) while a commit task holds
an open transaction, the next run's commit fences that transaction and commits exactly once,
the pipeline group's offsets equal to the ledger's ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, group_offsets, marker, resume_and_reap, zombie_pid
from eo_harness import poll_until
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import DRIVER, AirflowEnv, _kill_group

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

SHARDS = 3

# The demo pipeline with three commit shards: shards 0 and 1 are published in parallel,
# then shard 2, whose transaction moves the pipeline's consumer group.
PIPELINES = '''
"""The demo pipeline with three commit shards."""
import dataclasses

from eo_demo_pipelines import demo_pipeline


def sharded():
    return dataclasses.replace(demo_pipeline(), commit_shards=3)
'''

DAG = '''
"""plan >> prepare >> wait >> commit, the commit on Spark executors (commit_mode="spark").
EO_TEST_COMMIT_ZOMBIE=<file>: the first commit task to reach its transaction's end stops
itself there (testing/faults.py "zombie")."""
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

zombie = os.environ.get("EO_TEST_COMMIT_ZOMBIE")
commit_conf = (
    {
        "spark.executorEnv.EO_FAULT": "commit.before_end_txn",
        "spark.executorEnv.EO_FAULT_ACTION": "zombie",
        "spark.executorEnv.EO_FAULT_ONCE": zombie,
    }
    if zombie
    else {}
)

with DAG(
    dag_id="eo_commit_spark",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
) as dag:
    eo_pipeline_group(
        "eo_commit_pipelines:sharded",
        group_id="eo",
        commit_mode="spark",
        commit_kwargs={"conf": commit_conf},
        poke_interval=1,
        timeout=600,
        retries=0,
        retry_delay=timedelta(seconds=1),
    )
'''


# The commit task alone, on the checkpoint the killed run planned: what Airflow runs when it
# retries a commit task whose process died (the plan and prepare tasks of that run are done).
RETRY_DAG = '''
"""The commit task of eo_commit_spark alone, on checkpoint 1 (its retry)."""
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_eo.operators.commit import EoCommitOperator

with DAG(dag_id="eo_commit_spark_retry", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
    EoCommitOperator(
        task_id="commit", pipeline="eo_commit_pipelines:sharded", checkpoint_id=1, commit_mode="spark"
    )
'''


def _sharded(airflow_env: AirflowEnv) -> Any:
    import dataclasses

    return dataclasses.replace(airflow_env.pipeline(), commit_shards=SHARDS)


def _setup(airflow_env: AirflowEnv, kafka_bootstrap: str) -> tuple[Any, int]:
    (airflow_env.dags / "eo_commit_pipelines.py").write_text(PIPELINES)
    (airflow_env.dags / "eo_commit_spark.py").write_text(DAG)
    (airflow_env.dags / "eo_commit_spark_retry.py").write_text(RETRY_DAG)
    airflow_env.env["EO_DEMO_MAX_RECORDS"] = "1000"  # one checkpoint takes the whole input
    pipeline = _sharded(airflow_env)
    committed, _aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])
    return pipeline, committed


def _assert_exactly_once(pipeline: Any, committed: int) -> None:
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
        checkpoints = ledger.list_checkpoints(pipeline.name)
        assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
        assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED]
        assert checkpoints[0].records == committed
        assert_group_offsets_match_ledger(pipeline, ledger)
    assert_sink_is_source_exactly_once(pipeline.kafka, pipeline, source_records=committed)


def _processes_with_env(key: str, value: str) -> list[int]:
    """This user's processes whose environment has ``key=value`` (everything a dag.test
    driver started inherits the test's unique pipeline name)."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":  # exited, waiting for its parent
                    found.append(int(entry.name))
    return found


def _stop_leftovers(airflow_env: AirflowEnv, grace_s: float = 30.0) -> list[int]:
    """Wait up to ``grace_s`` for every process of this test's pipeline to end, then SIGCONT
    and SIGKILL what is left; returns the pids that had to be killed."""
    name = airflow_env.env["EO_DEMO_PIPELINE"]
    poll_until(lambda: not _processes_with_env("EO_DEMO_PIPELINE", name), grace_s, interval=0.5)
    left = _processes_with_env("EO_DEMO_PIPELINE", name)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    return left


def test_spark_mode_commit_is_published_by_spark_tasks_not_the_airflow_task(
    airflow_env: AirflowEnv, kafka_bootstrap: str
) -> None:
    pipeline, committed = _setup(airflow_env, kafka_bootstrap)

    try:
        (run,) = airflow_env.run_dag_test("eo_commit_spark", runs=1)
    finally:
        leftovers = _stop_leftovers(airflow_env)

    assert run["state"] == "success", run
    task_pid = airflow_env.procs[-1].pid  # dag.test runs every task in its own process
    out = run["xcoms"]["eo.commit"]
    assert out["state"] == "COMMITTED" and out["commit_mode"] == "spark", out
    assert out["published"] == committed and out["shards_skipped"] == 0, out
    publishers = out["publishers"]
    assert [p["shard"] for p in publishers] == list(range(SHARDS)), out
    # Every record was produced by a Python worker of the commit job's Spark tasks (local
    # master: in the driver JVM, executor "driver"): not by the Airflow task process, not by
    # the commit application's driver process.
    driver = out["spark_driver"]
    assert all(p["pid"] not in (task_pid, driver["pid"]) for p in publishers), (task_pid, out)
    assert driver["pid"] != task_pid, out
    assert all(p["executor"] == "driver" and not p["skipped"] for p in publishers), out
    assert sum(p["records"] for p in publishers) == committed, out
    log = airflow_env.log_text()
    assert "apps/commit.py" in log and "on Spark executors" in log
    _assert_exactly_once(pipeline, committed)
    with Ledger(pipeline.ledger_url) as ledger:
        events = ledger.events(pipeline.name, 1)
    committed_event = [e for e in events if e.to_state is CheckpointState.COMMITTED]
    assert len(committed_event) == 1 and committed_event[0].task_id == "eo.commit", events
    assert leftovers == [], f"processes still running after the DAG run: {leftovers}"


def test_airflow_task_killed_mid_commit_job_retry_commits_exactly_once(
    airflow_env: AirflowEnv, kafka_bootstrap: str, tmp_path: Path
) -> None:
    pipeline, committed = _setup(airflow_env, kafka_bootstrap)
    flag = tmp_path / "zombie"
    env = {**airflow_env.env, "EO_TEST_COMMIT_ZOMBIE": str(flag)}
    log = airflow_env.home / "dagtest-killed.log"
    airflow_env.logs.append(log)
    zombie = None
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log.open("w") as output:
            # Its own process group: the Airflow task process (dag.test runs the tasks in it)
            # and the spark-submit it starts, with the commit application's driver.
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER), "--dag-module", "eo_commit_spark", "--runs", "1"],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        airflow_env.procs.append(proc)
        zombie = zombie_pid(
            flag,
            timeout=420,
            gone=lambda: (
                None
                if proc.poll() is None
                else f"dag.test exited ({proc.returncode}):\n{log.read_text(errors='replace')[-6000:]}"
            ),
        )
        # One commit task's records, marker and (if it is the last shard) the group's
        # offsets sit in its open transaction. The Airflow task process dies with its
        # spark-submit child and the driver (a worker host lost mid-job).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert "injected fault at commit.before_end_txn: zombie" in log.read_text(errors="replace")
        with Ledger(pipeline.ledger_url) as ledger:
            (cp,) = ledger.list_checkpoints(pipeline.name)
            assert cp.state is CheckpointState.PREPARED
        assert marker(pipeline, SHARDS - 1) < cp.checkpoint_id  # the last shard never committed
        source = [(pipeline.source_topics[0], p) for p in range(3)]
        assert group_offsets(pipeline, source) == {}  # the group did not move

        # The commit task's retry: its commit job fences the stopped task's transaction
        # (still open: the broker aborts it only after transaction_timeout_ms).
        (run,) = airflow_env.run_dag_test("eo_commit_spark_retry", runs=1, commit_task="commit")
        assert run["state"] == "success", run
        out = run["xcoms"]["commit"]
        assert out["checkpoint_id"] == cp.checkpoint_id, out
        assert out["state"] == "COMMITTED" and out["commit_mode"] == "spark", out
        retry_pid = airflow_env.procs[-1].pid
        assert all(p["pid"] not in (retry_pid, zombie) for p in out["publishers"]), out
        # A shard the killed job committed is skipped by its marker; the stopped task's
        # shard and the last one are published by this job.
        assert [p["shard"] for p in out["publishers"]] == list(range(SHARDS)), out
        assert not out["publishers"][-1]["skipped"] and 0 < out["published"] <= committed, out
    finally:
        if proc is not None:
            _kill_group(proc)
        if zombie is not None:
            resume_and_reap(zombie)
        leftovers = _stop_leftovers(airflow_env)
    # The zombie's transaction was aborted by the fence: nothing of it is visible.
    _assert_exactly_once(pipeline, committed)
    assert leftovers == [], f"processes still running after the test: {leftovers}"
