"""The distributed commit on a Spark standalone master + worker: ``eo commit --commit-mode
spark`` publishes every record from executor processes, and survives an executor killed
mid-shard, its driver killed mid-job, and a task attempt that outlives its executor while
Spark re-runs it (a zombie): exactly once against the source, the group's offsets never
past the ledger's committed ends."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import group_offsets, marker, resume_and_reap, zombie_pid
from eo_harness import parse_json_line
from eo_spark_standalone import StandaloneCluster

from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), cores=2, memory="1g")
    standalone.up()
    try:
        yield standalone
    finally:
        standalone.down()


def _on_cluster(h: Any, cluster: StandaloneCluster, **executor_env: str) -> Any:
    conf = {"spark.master": cluster.master_url, "spark.executor.memory": "512m", "spark.ui.enabled": "false"}
    conf.update({f"spark.executorEnv.{k}": v for k, v in executor_env.items()})
    return h.with_(spark_conf=conf)


def _prepared(harness: Callable[..., Any], records: int, **kw: Any) -> tuple[Any, int]:
    h = harness(source_partitions=2, sink_partitions=2, commit_shards=2, **kw)
    h.produce(records, keys=17)
    planned = h.plan()
    assert planned.records is None or planned.records == records
    h.prepare(planned.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).records == records
    return h, planned.checkpoint_id


def _source(h: Any) -> list[tuple[str, int]]:
    return [(h.pipeline.source_topics[0], p) for p in (0, 1)]


def _assert_group_not_past_ledger(h: Any) -> None:
    """The pipeline group's committed offsets never exceed the ledger's committed ends."""
    ends: dict[tuple[str, int], int] = {}
    for cp in h.ledger.list_checkpoints(h.pipeline.name):
        if cp.state is CheckpointState.COMMITTED:
            for r in cp.ranges:
                ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.end)
    for tp, offset in group_offsets(h.pipeline, _source(h)).items():
        assert offset <= ends.get(tp, 0), (tp, offset, ends)


def test_every_record_published_by_executors(harness: Callable[..., Any], cluster: StandaloneCluster) -> None:
    # About 25k records a shard; bench/commit_scale.py checks the same at 1M and 4M records.
    records = 50_000
    h, cid = _prepared(harness, records, max_records_per_checkpoint=records)
    proc = _on_cluster(h, cluster).cli("commit", "--commit-mode", "spark", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = parse_json_line(proc.stdout)
    assert summary["checkpoint_id"] == cid and summary["state"] == "COMMITTED"
    committer = summary["committer"]
    publishers = summary["publishers"]
    assert [p["shard"] for p in publishers] == [0, 1]
    # Every record came from a Python worker of a standalone executor: none from the process
    # that ran `eo commit` (nor from its driver JVM's workers: executor "driver").
    assert all(p["pid"] != committer["pid"] for p in publishers), summary
    assert all(p["executor"] not in ("driver", "local", "unknown") for p in publishers), summary
    assert sum(p["records"] for p in publishers) == records, summary
    h.assert_exactly_once(expected_records=records)


def test_executor_killed_mid_shard_is_retried_by_spark_exactly_once(
    harness: Callable[..., Any], cluster: StandaloneCluster, tmp_path: Path
) -> None:
    records = 20_000
    h, cid = _prepared(harness, records)
    fired = tmp_path / "fault-fired"
    faulty = _on_cluster(
        h,
        cluster,
        EO_FAULT="commit.after_begin",
        EO_FAULT_ACTION="kill-executor",
        EO_FAULT_ONCE=str(fired),
    )
    proc = faulty.cli("commit", "--commit-mode", "spark", timeout=600)
    assert fired.exists(), "the fault never fired: " + proc.stderr[-2000:]
    if proc.returncode != 0:  # Spark gave up on the task: a re-run finishes it
        _assert_group_not_past_ledger(h)
        proc = _on_cluster(h, cluster).cli("commit", "--commit-mode", "spark", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = parse_json_line(proc.stdout)
    assert summary["state"] == "COMMITTED", summary
    h.assert_exactly_once(expected_records=records)
    again = _on_cluster(h, cluster).cli("commit", "--commit-mode", "spark", "--checkpoint", str(cid))
    assert again.returncode == 0 and parse_json_line(again.stdout)["published"] == 0


def _commit_with_a_zombie(h: Any, cluster: StandaloneCluster, tmp_path: Path) -> tuple[Any, Path]:
    """`eo commit --commit-mode spark` whose first commit task to reach the end of its
    transaction stops itself there (marker and records sent, commit_transaction next)."""
    flag = tmp_path / "zombie"
    faulty = _on_cluster(
        h, cluster, EO_FAULT="commit.before_end_txn", EO_FAULT_ACTION="zombie", EO_FAULT_ONCE=str(flag)
    )
    return faulty.cli("commit", "--commit-mode", "spark", wait=False), flag


def _jvm_above(pid: int) -> int:
    while pid > 1:
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"java"):
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no JVM above the zombie")


def test_driver_killed_mid_job_then_rerun_fences_the_orphaned_task(
    harness: Callable[..., Any], cluster: StandaloneCluster, tmp_path: Path
) -> None:
    records = 20_000
    h, cid = _prepared(harness, records)
    child, flag = _commit_with_a_zombie(h, cluster, tmp_path)
    zombie = None
    try:
        zombie = zombie_pid(flag, child=child)
        # Shard 0's records and marker sit in the stopped task's open transaction.
        child.send_signal(signal.SIGKILL)  # the driver, mid-job
        child.proc.wait(30)
        assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
        assert marker(h.pipeline, 1) < cid  # the last shard never began: the group did not move
        _assert_group_not_past_ledger(h)
        rerun = _on_cluster(h, cluster).cli("commit", "--commit-mode", "spark", timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert parse_json_line(rerun.stdout)["state"] == "COMMITTED"
    finally:
        if zombie is not None:
            resume_and_reap(zombie)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.proc.wait(30)
    # The orphaned attempt's transaction was fenced by the re-run: nothing of it is visible.
    h.assert_exactly_once(expected_records=records)


def test_task_attempt_alive_while_spark_reruns_it_is_fenced(
    harness: Callable[..., Any], cluster: StandaloneCluster, tmp_path: Path
) -> None:
    records = 20_000
    h, cid = _prepared(harness, records)
    child, flag = _commit_with_a_zombie(h, cluster, tmp_path)
    zombie = None
    try:
        zombie = zombie_pid(flag, child=child)
        # The executor dies under the stopped attempt, which lives on: Spark re-runs the task
        # on a new executor while the first attempt still holds its open transaction.
        os.kill(_jvm_above(zombie), signal.SIGKILL)
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err.decode()[-3000:]
        summary = parse_json_line(out.decode())
        assert summary["state"] == "COMMITTED", summary
        retried = [p for p in summary["publishers"] if p["attempt"] > 0]
        assert retried, summary  # the killed shard was published by a later attempt
    finally:
        if zombie is not None:
            resume_and_reap(zombie)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.proc.wait(30)
    h.assert_exactly_once(expected_records=records)
    assert marker(h.pipeline, 0) == cid and marker(h.pipeline, 1) == cid


# A Python UDF: pickled by reference to this module, which exists only on the driver's path.
UDF_MODULE = """
from pyspark.sql import functions as F
from pyspark.sql.types import StringType


def tag(value):
    return "udf:" + bytes(value).decode()


def enrich(df):
    return df.withColumn("value", F.udf(tag, StringType())(F.col("value")))
"""


def test_cli_run_once_ships_a_python_udf_transform_to_the_cluster(
    harness: Callable[..., Any], cluster: StandaloneCluster, tmp_path: Path
) -> None:
    import uuid

    from airflow_provider_eo.kafka.audit import read_sink

    records = 6000
    code = tmp_path / "user-code"
    code.mkdir()
    module = f"team_udf_{uuid.uuid4().hex[:6]}"
    (code / f"{module}.py").write_text(UDF_MODULE)
    h = harness(source_partitions=2, sink_partitions=2, transform=f"{module}:enrich")
    h.produce(records)
    on_cluster = _on_cluster(h, cluster)
    os.environ["PYTHONPATH"] = f"{code}{os.pathsep}{os.environ['PYTHONPATH']}"  # the driver only
    try:
        proc = on_cluster.cli("run-once", "--commit-mode", "spark", timeout=600)
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]
    assert proc.returncode == 0, proc.stderr[-4000:] + cluster.executor_logs()[-3000:]
    assert f"{module}.py" in proc.stderr and "shipping to the executors (addPyFile)" in proc.stderr
    summary = parse_json_line(proc.stdout)
    assert summary["state"] == "COMMITTED" and summary["records"] == records, summary
    values = [r.value().decode() for r in read_sink(h.config, h.pipeline.sink_topic)]
    assert len(values) == records and all(v.startswith("udf:") for v in values)
    h.assert_exactly_once(expected_records=records)


def test_a_commit_task_delayed_past_its_driver_and_an_abort_publishes_nothing(
    harness: Callable[..., Any], cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """On executors: the first commit task stops before its shard began; the driver is
    killed (the lease is no longer kept, no job is cancelled) and `eo abort --force-live`
    fences, finds no marker and ABORTS; then the task goes on. Its init_transactions comes
    after the abort's fence: the abort mark stops it. The replanned range is committed on the
    cluster: every source record once."""
    from airflow_provider_eo.core.abort import abort_checkpoint

    records = 6000
    h, cid = _prepared(harness, records)
    flag = tmp_path / "delayed-task"
    faulty = _on_cluster(
        h, cluster, EO_FAULT="commit.task_start", EO_FAULT_ACTION="zombie", EO_FAULT_ONCE=str(flag)
    )
    child = faulty.cli("commit", "--commit-mode", "spark", wait=False)
    task = None
    try:
        task = zombie_pid(flag, child=child)
        child.send_signal(signal.SIGKILL)  # the driver, mid-job: shard 1 (the last) never starts
        child.proc.wait(30)
        aborted = abort_checkpoint(h.pipeline, h.ledger, cid, reason="commit stuck", force_live=True)
        assert aborted.state is CheckpointState.ABORTED
        resume_and_reap(task)  # fences nothing the abort needs; reads the abort mark; refuses
        task = None
    finally:
        if task is not None:
            resume_and_reap(task)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.proc.wait(30)
    assert marker(h.pipeline, 0) < cid and marker(h.pipeline, 1) < cid
    replanned = h.plan()
    assert replanned.checkpoint_id > cid
    h.prepare(replanned.checkpoint_id)
    proc = _on_cluster(h, cluster).cli("commit", "--commit-mode", "spark", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert parse_json_line(proc.stdout)["state"] == "COMMITTED"
    _assert_group_not_past_ledger(h)
    h.assert_exactly_once(expected_records=records)
