"""The commit as a Spark job (``commit_mode="spark"``) on the test session's local Spark:
every shard's transaction runs in a Python worker of a Spark task, never in the process that
commits; the pipeline's group moves only with the last shard, after the others committed;
a checkpoint half committed in one mode is finished by the other."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import (
    assert_group_offsets_match_ledger,
    group_offsets,
    kill_child,
    marker,
    resume_and_reap,
    zombie_pid,
)
from eo_harness import parse_json_line, wait_for

from airflow_provider_eo import names
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.shard import Publisher, ShardFailure, ShardTask
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.spark.commit import SparkShardRunner

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 3000


def _prepared(harness: Callable[..., Any], **kw: Any) -> tuple[Any, int]:
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3, **kw)
    h.produce(RECORDS, keys=13)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    return h, planned.checkpoint_id


def _source(h: Any) -> list[tuple[str, int]]:
    return [(h.pipeline.source_topics[0], p) for p in (0, 1)]


def test_spark_mode_publishes_every_shard_in_spark_tasks(harness: Callable[..., Any]) -> None:
    h, cid = _prepared(harness)
    result = commit_checkpoint(
        h.pipeline, h.ledger, cid, commit_mode="spark", runner=SparkShardRunner(h.pipeline, h.spark)
    )
    assert result.mode == "spark"
    assert result.checkpoint.state is CheckpointState.COMMITTED
    by_shard = {p.shard: p for p in result.publishers}
    assert sorted(by_shard) == [0, 1, 2]
    # Published by Spark's Python workers, none by this (the committing) process.
    assert all(p.pid != os.getpid() for p in result.publishers), result.publishers
    assert all(p.executor == "driver" and not p.skipped for p in result.publishers), result.publishers
    assert sum(p.records for p in result.publishers) == RECORDS == result.published
    rows = {s.shard: s for s in h.ledger.get(h.pipeline.name, cid).shards}
    assert all(rows[s].state.value == "COMMITTED" for s in range(3))
    assert sum(rows[s].records for s in range(3)) == RECORDS
    h.assert_exactly_once(expected_records=RECORDS)
    # Committing again does nothing.
    again = commit_checkpoint(
        h.pipeline, h.ledger, cid, commit_mode="spark", runner=SparkShardRunner(h.pipeline, h.spark)
    )
    assert again.published == 0 and again.note == "already COMMITTED"


class _Wrapped:
    """A real Spark runner wrapped by a test runner (same placement answers)."""

    def __init__(self, inner: SparkShardRunner) -> None:
        self.inner = inner

    @property
    def master(self) -> str:
        return self.inner.master

    @property
    def session_running(self) -> bool:
        return self.inner.session_running

    @property
    def executors_elsewhere(self) -> bool:
        return self.inner.executors_elsewhere


class _StopBeforeLast(_Wrapped):
    """A runner that runs the first phase on Spark, then 'dies' before the last shard (the
    one that moves the pipeline's group): a driver lost between the two phases."""

    def __init__(self, inner: SparkShardRunner) -> None:
        super().__init__(inner)
        self.calls = 0

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt("driver lost before the last shard")
        return self.inner.run(tasks, on_outcome)


def test_group_moves_only_after_every_other_shard_and_local_mode_finishes_it(
    harness: Callable[..., Any],
) -> None:
    h, cid = _prepared(harness)
    runner = _StopBeforeLast(SparkShardRunner(h.pipeline, h.spark))
    with pytest.raises(KeyboardInterrupt):
        commit_checkpoint(h.pipeline, h.ledger, cid, commit_mode="spark", runner=runner)
    # Shards 0 and 1 committed in Spark tasks; shard 2 (it moves the group) never began, so
    # the group has not moved past anything: it moved not at all.
    assert [marker(h.pipeline, s) >= cid for s in range(3)] == [True, True, False]
    assert group_offsets(h.pipeline, _source(h)) == {}
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    # A local-mode retry finishes the same checkpoint: the two done shards are skipped.
    done = commit_checkpoint(h.pipeline, h.ledger, cid, commit_mode="local")
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert done.shards_skipped == 2 and done.published == sum(
        s.records for s in h.ledger.get(h.pipeline.name, cid).shards if s.shard == 2
    )
    assert [p.executor for p in done.publishers] == ["local"] * 3
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    h.assert_exactly_once(expected_records=RECORDS)


def test_spark_mode_without_a_runner_is_refused_and_auto_stays_local(harness: Callable[..., Any]) -> None:
    h, cid = _prepared(harness)
    with pytest.raises(ConfigError, match=rf"checkpoint {cid}: commit_mode 'spark' needs Spark"):
        commit_checkpoint(h.pipeline, h.ledger, cid, commit_mode="spark")
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    assert group_offsets(h.pipeline, _source(h)) == {}
    # auto on a local master (its executors are this process's JVM): this process commits.
    assert SparkShardRunner(h.pipeline, h.spark).executors_elsewhere is False
    result = commit_checkpoint(
        h.pipeline, h.ledger, cid, commit_mode="auto", runner=SparkShardRunner(h.pipeline, h.spark)
    )
    assert result.mode == "local" and {p.pid for p in result.publishers} == {os.getpid()}
    h.assert_exactly_once(expected_records=RECORDS)


def test_cli_commit_json_names_the_publishers(harness: Callable[..., Any]) -> None:
    h, cid = _prepared(harness)
    proc = h.cli("commit", "--commit-mode", "spark")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = parse_json_line(proc.stdout)
    assert summary["checkpoint_id"] == cid and summary["commit_mode"] == "spark"
    publishers = summary["publishers"]
    assert [p["shard"] for p in publishers] == [0, 1, 2]
    assert all({"shard", "host", "pid", "records"} <= set(p) for p in publishers)
    assert sum(p["records"] for p in publishers) == RECORDS
    h.assert_exactly_once(expected_records=RECORDS)
    bad = h.cli("commit", "--commit-mode", "cluster")
    assert bad.returncode != 0
    assert "commit_mode='cluster' must be one of local, spark, auto" in " ".join(bad.stderr.split())


class _Spy(_Wrapped):
    """The real Spark runner, recording every shard outcome it returned."""

    def __init__(self, inner: SparkShardRunner) -> None:
        super().__init__(inner)
        self.outcomes: list[Publisher | ShardFailure | BaseException] = []

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        out = self.inner.run(tasks, on_outcome)
        self.outcomes.extend(o for _s, o in out)
        return out


def test_stream_commits_through_spark_jobs_in_its_own_session(harness: Callable[..., Any]) -> None:
    import dataclasses

    from airflow_provider_eo.core.stream import run_stream
    from airflow_provider_eo.spark.stager import SparkStager

    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3, max_records_per_checkpoint=1000)
    pipeline = dataclasses.replace(h.pipeline, commit_mode="spark")
    h.produce(RECORDS, keys=13)
    spy = _Spy(SparkShardRunner(pipeline, h.spark))
    result = run_stream(
        pipeline,
        ledger=h.ledger,
        stager=SparkStager(h.spark),
        runner=spy,
        interval_s=0.2,
        max_checkpoints=3,
    )
    assert [c.state for c in result.checkpoints] == ["COMMITTED"] * 3, result.summary()
    assert result.records == RECORDS
    # 3 checkpoints x 3 shards, each published by a Spark task's Python worker.
    published = [o for o in spy.outcomes if isinstance(o, Publisher)]
    assert len(published) == 9 and len(spy.outcomes) == 9, spy.outcomes
    assert all(p.pid != os.getpid() for p in published)
    assert sum(p.records for p in published) == RECORDS
    h.assert_exactly_once(expected_records=RECORDS)


def test_a_task_delayed_past_the_lease_and_an_abort_publishes_nothing(
    harness: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`eo commit --commit-mode spark` whose commit task is held up before its shard began
    (queued behind others, a slow executor); its driver dies, so the lease is no longer kept;
    `eo abort --force-live` fences, finds no marker and ABORTS. Then the task goes on: its
    init_transactions comes after the abort's fence, so only the abort mark can stop it. The
    range is replanned and committed: the sink holds every source record once."""
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=1)
    h.produce(RECORDS, keys=13)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    cid = planned.checkpoint_id
    flag = tmp_path / "delayed-task"
    monkeypatch.setenv("EO_FAULT_ONCE", str(flag))  # the child's env is a copy of this one
    child = h.cli("commit", "--commit-mode", "spark", fault="commit.task_start", action="zombie", wait=False)
    task = None
    try:
        task = zombie_pid(flag, child=child)  # the commit task, stopped before its shard
        kill_child(child)  # the driver dies: nothing renews the lease, nothing cancels
        assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
        aborted = abort_checkpoint(h.pipeline, h.ledger, cid, reason="commit stuck", force_live=True)
        assert aborted.state is CheckpointState.ABORTED
        resume_and_reap(task)  # the task goes on after the abort: init, mark read, refused
        task = None
    finally:
        if task is not None:
            resume_and_reap(task)
        kill_child(child)
    assert h.sink_records() == []  # read_committed: the late task published nothing
    # The range is replanned and committed in Spark tasks: every source record once.
    replanned = h.plan()
    assert replanned.checkpoint_id > cid and replanned.records in (None, RECORDS)
    h.prepare(replanned.checkpoint_id)
    done = commit_checkpoint(
        h.pipeline,
        h.ledger,
        replanned.checkpoint_id,
        commit_mode="spark",
        runner=SparkShardRunner(h.pipeline, h.spark),
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED and done.published == RECORDS
    assert len(h.sink_records()) == RECORDS
    h.assert_exactly_once(expected_records=RECORDS)


def test_cancel_stops_the_checkpoints_commit_jobs_and_no_other(harness: Callable[..., Any]) -> None:
    """What the lease keeper calls when the lease is lost: Spark cancels the jobs of that
    checkpoint's job group (a running Python task is killed, long before it would end) and
    leaves another checkpoint's alone."""
    import threading
    import time

    h = harness()
    runner = SparkShardRunner(h.pipeline, h.spark)
    sc = h.spark.sparkContext
    ended: dict[int, str] = {}

    def job(checkpoint_id: int, seconds: float) -> None:
        sc.setJobGroup(names.commit_app_name(h.pipeline.name, checkpoint_id), f"checkpoint {checkpoint_id}")
        try:
            sc.parallelize([seconds], 1).map(lambda s: time.sleep(s) or s).collect()
            ended[checkpoint_id] = "done"
        except Exception as exc:
            ended[checkpoint_id] = f"failed: {exc}"

    started = time.monotonic()
    threads = [threading.Thread(target=job, args=(7, 120.0)), threading.Thread(target=job, args=(8, 8.0))]
    for t in threads:
        t.start()
    wait_for(
        lambda: len(sc.statusTracker().getActiveJobsIds() or []) >= 2, "the two jobs to run", timeout=120
    )
    runner.cancel(h.pipeline.name, 7)
    for t in threads:
        t.join(150)
    assert ended[8] == "done", ended
    assert ended[7].startswith("failed") and "cancel" in ended[7].lower(), ended
    assert time.monotonic() - started < 100  # killed, not waited for
