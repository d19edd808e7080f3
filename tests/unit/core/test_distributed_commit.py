"""The spark commit mode's protocol (core/commit.py + the task body of spark/commit.py) on a
real SQLite ledger, real staged Parquet and a fake Kafka, with an in-process shard runner
that runs each shard task the way a Spark task would: where the group moves, what the
driver records and when, how a task's failure comes back, and which mode ``auto`` picks.

Exactly-once is counted on the fake broker's committed output."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, prepared_checkpoint

from airflow_provider_eo.core.commit import commit_checkpoint, resolve_commit_mode
from airflow_provider_eo.core.shard import Publisher, ShardFailure, ShardTask
from airflow_provider_eo.errors import CommitError, CommitFenced
from airflow_provider_eo.ledger import CheckpointState, Ledger, ShardState
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError
from airflow_provider_eo.spark import commit as spark_commit

OUT = "out"
SHARDS = 3
SINK_PARTITIONS = 3
OUTPUT = {0: [b"a0", b"a1"], 1: [b"b0"], 2: [b"c0", b"c1", b"c2"]}


class InProcessRunner:
    """Runs each shard task through spark/commit.py's task body (as a Spark task would),
    recording the phases and what the ledger held when each phase started."""

    master = "spark://cluster:7077"
    session_running = True
    executors_elsewhere = True

    def __init__(
        self,
        clients: FakeClients,
        ledger: Ledger,
        pipeline: Pipeline,
        *,
        attempt: int = 0,
        fail_shard: int | None = None,
    ) -> None:
        self.clients = clients
        self.ledger = ledger
        self.pipeline = pipeline
        self.attempt = attempt
        self.fail_shard = fail_shard
        self.phases: list[list[int]] = []
        self.rows_at_start: list[dict[int, str]] = []
        self.marks_at_start: list[int] = []

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        self.phases.append([t.committable.shard for t in tasks])
        cp = self.ledger.get(self.pipeline.name, 1)
        self.rows_at_start.append({s.shard: s.state.value for s in cp.shards})
        self.marks_at_start.append(self.clients.broker.mark(self.pipeline.group_id, "in", 0))
        out: list[tuple[int, Publisher | ShardFailure | BaseException]] = []
        for task in tasks:
            if task.committable.shard == self.fail_shard:
                out.append((task.committable.shard, RuntimeError("executor lost 4 times")))
                continue
            (outcome,) = list(spark_commit.run_shard_task([task], self.clients))
            out.append((task.committable.shard, outcome))
            on_outcome(outcome)
        return out


@pytest.fixture
def task_attempt(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    def set_attempt(n: int) -> None:
        monkeypatch.setattr(spark_commit, "_task_identity", lambda: ("7", n))

    set_attempt(0)
    return set_attempt


def test_shards_run_in_tasks_and_the_group_moves_last(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    runner = InProcessRunner(clients, ledger, pipeline)
    result = commit_checkpoint(
        pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
    )
    assert result.mode == "spark" and result.checkpoint.state is CheckpointState.COMMITTED
    # Every shard but the last in one parallel phase; the last (it moves the group) after.
    assert runner.phases == [[0, 1], [2]]
    # Every shard's row was PENDING before any task ran; the first two COMMITTED before the last.
    assert runner.rows_at_start == [
        {0: "PENDING", 1: "PENDING", 2: "PENDING"},
        {0: "COMMITTED", 1: "COMMITTED", 2: "PENDING"},
    ]
    assert runner.marks_at_start == [-1, -1]  # the group had not moved before the last shard ran
    assert broker.mark(pipeline.group_id, "in", 0) == 10
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values
    assert [(p.shard, p.executor, p.records) for p in sorted(result.publishers, key=lambda p: p.shard)] == [
        (0, "7", 2),
        (1, "7", 1),
        (2, "7", 3),
    ]
    rows = {s.shard: (s.state, s.records) for s in result.checkpoint.shards}
    assert rows == {0: (ShardState.COMMITTED, 2), 1: (ShardState.COMMITTED, 1), 2: (ShardState.COMMITTED, 3)}


def test_a_failed_shard_stops_before_the_group_moves_and_a_retry_finishes(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    failing = InProcessRunner(clients, ledger, pipeline, fail_shard=1)
    with pytest.raises(
        CommitError, match=r"checkpoint 1, shard 1: the Spark job that commits this shard failed"
    ):
        commit_checkpoint(
            pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=failing
        )
    assert failing.phases == [[0, 1]]  # the last shard never ran
    assert broker.mark(pipeline.group_id, "in", 0) == -1
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED
    # The retry (Spark again) skips shard 0 by its marker and publishes the rest once.
    task_attempt(0)
    retry = InProcessRunner(clients, ledger, pipeline)
    done = commit_checkpoint(
        pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=retry
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert {p.shard: p.skipped for p in done.publishers} == {0: True, 1: False, 2: False}
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values


def test_a_task_error_comes_back_as_the_same_eo_error(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)

    def fenced(*_a: Any, **_k: Any) -> Any:
        raise CommitFenced("pipeline 'orders', checkpoint 1, shard 0: fenced by a newer committer")

    monkeypatch.setattr(spark_commit, "commit_shard", fenced)
    runner = InProcessRunner(clients, ledger, pipeline)
    with pytest.raises(CommitFenced, match=r"shard 0: fenced by a newer committer \(in the commit task on "):
        commit_checkpoint(
            pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
        )
    assert broker.mark(pipeline.group_id, "in", 0) == -1


class ExecutorLostAfterCommit(InProcessRunner):
    """Shard 0's task commits, then its executor is lost before the outcome reaches the
    driver, and the marker group's offsets are deleted (``kafka-consumer-groups
    --delete-offsets``, or expired). ``spark_retries``: Spark runs the task again (attempt
    1) in the same job; else the job fails and the commit fails with it."""

    def __init__(self, *args: Any, spark_retries: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spark_retries = spark_retries
        self.retried: list[Publisher | ShardFailure] = []
        self.lost = False

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        zero = [t for t in tasks if t.committable.shard == 0]
        if self.lost or not zero:
            return super().run(tasks, on_outcome)
        self.lost = True
        (committed,) = list(spark_commit.run_shard_task(zero, self.clients))
        assert isinstance(committed, Publisher) and not committed.skipped  # it published
        self.clients.broker.marks.clear()  # every marker gone
        out = super().run([t for t in tasks if t.committable.shard != 0], on_outcome)
        if not self.spark_retries:
            return [(0, RuntimeError("executor lost 4 times")), *out]
        # Spark's retry, on another executor (the task_attempt fixture restores this)
        spark_commit._task_identity = lambda: ("8", 1)  # type: ignore[assignment]
        (retried,) = list(spark_commit.run_shard_task(zero, self.clients))
        self.retried.append(retried)
        on_outcome(retried)
        return [(0, retried), *out]


@pytest.mark.parametrize(
    "spark_retries", [True, False], ids=["spark-retries-the-task", "the-commit-is-retried"]
)
def test_a_retried_task_reads_back_when_the_marker_is_gone(
    spark_retries: bool,
    pipeline: Pipeline,
    ledger: Ledger,
    broker: FakeBroker,
    task_attempt: Any,
) -> None:
    """A shard's task committed, its outcome was lost with its executor, and its marker is
    gone. The driver recorded every shard PENDING before any task began, so the shard "may
    have begun": that is decided by reading the committed output back, never by the marker's
    absence. Spark's retry of the task (attempt 1: a retry may follow an attempt that began)
    and the commit's retry (attempt 0 of a new job, told the ledger had a row for the shard)
    both find the output there and skip it: each record once, never twice."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    runner = ExecutorLostAfterCommit(clients, ledger, pipeline, spark_retries=spark_retries)
    if spark_retries:
        done = commit_checkpoint(
            pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
        )
        (retried,) = runner.retried
        assert isinstance(retried, Publisher) and retried.skipped and retried.attempt == 1
    else:
        with pytest.raises(CommitError, match=r"shard 0: the Spark job that commits this shard failed"):
            commit_checkpoint(
                pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
            )
        rows = {s.shard: s.state for s in ledger.get(pipeline.name, cp.checkpoint_id).shards}
        assert rows[0] is ShardState.PENDING  # the driver never heard of shard 0's commit
        done = commit_checkpoint(
            pipeline,
            ledger,
            cp.checkpoint_id,
            clients=clients,
            commit_mode="spark",
            runner=InProcessRunner(clients, ledger, pipeline),
        )
        assert {p.shard: (p.skipped, p.attempt) for p in done.publishers}[0] == (True, 0)
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert broker.count("read_back") >= 1
    for p, values in OUTPUT.items():  # each record once
        assert broker.values(OUT, p) == values


@pytest.mark.parametrize(
    ("requested", "master", "records", "expected"),
    [
        ("local", "spark://m:7077", 10**9, "local"),
        ("spark", "local[2]", 0, "spark"),
        ("auto", "local[2]", 10**9, "local"),
        ("auto", "local", 10**9, "local"),
        ("auto", "local-cluster[2,1,1024]", 10**9, "local"),
        ("auto", "spark://m:7077", 199_999, "local"),
        ("auto", "spark://m:7077", 200_000, "spark"),
        ("auto", "yarn", 10**6, "spark"),
        ("auto", "k8s://https://api:6443", 10**6, "spark"),
    ],
)
def test_auto_picks_spark_only_on_a_cluster_for_a_large_checkpoint(
    requested: str, master: str, records: int, expected: str
) -> None:
    assert resolve_commit_mode(requested, master=master, records=records, min_records=200_000) == expected


@pytest.mark.parametrize(
    ("running", "elsewhere", "records", "expected"),
    [
        (True, True, 200_000, "spark"),
        (True, False, 10**9, "local"),  # executors on this host: processes, not cores
        (False, True, 1_999_999, "local"),  # a new application's start is paid first
        (False, True, 2_000_000, "spark"),
    ],
)
def test_auto_weighs_the_session_and_where_its_executors_are(
    running: bool, elsewhere: bool, records: int, expected: str
) -> None:
    got = resolve_commit_mode(
        "auto",
        master="spark://m:7077",
        records=records,
        min_records=200_000,
        session_running=running,
        executors_elsewhere=elsewhere,
    )
    assert got == expected


def test_commit_mode_is_validated_and_travels(pipeline: Pipeline) -> None:
    with pytest.raises(PipelineConfigError, match=r"commit_mode='cluster' must be one of local, spark, auto"):
        dataclasses.replace(pipeline, commit_mode="cluster")  # type: ignore[arg-type]
    with pytest.raises(PipelineConfigError, match="spark_commit_min_records must be >= 0"):
        dataclasses.replace(pipeline, spark_commit_min_records=-1)
    spark = dataclasses.replace(pipeline, commit_mode="spark", spark_commit_min_records=5)
    back = Pipeline.from_json(spark.to_json())
    assert (back.commit_mode, back.spark_commit_min_records) == ("spark", 5)


def test_this_host_is_recognised_whatever_spark_calls_it() -> None:
    """Spark may name the driver ``localhost`` and an executor on the same machine
    ``127.0.0.1``: both are this host, so ``auto`` stays local there."""
    import socket

    assert spark_commit._on_this_host("127.0.0.1", "localhost")
    assert spark_commit._on_this_host("localhost", "127.0.0.1")
    assert spark_commit._on_this_host(socket.gethostname(), "localhost")
    assert not spark_commit._on_this_host("no-such-host.invalid", "localhost")
