"""The spark commit mode's protocol (core/commit.py + the task body of spark/commit.py) on a
real SQLite ledger, real staged Parquet and a fake Kafka, with an in-process shard runner
that runs each shard task the way a Spark task would: where the group moves, what the
driver records and when, how a task's failure comes back, and which mode ``auto`` picks.

Exactly-once is counted on the fake broker's committed output."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException
from eo_fake_kafka import FakeBroker, FakeClients, prepared_checkpoint
from eo_harness import wait_for

from airflow_provider_eo import names
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint, resolve_commit_mode
from airflow_provider_eo.core.commit_on_spark import _LeaseKeeper
from airflow_provider_eo.core.shard import Publisher, ShardCommittable, ShardFailure, ShardTask
from airflow_provider_eo.errors import (
    AbortRefused,
    CheckpointAborted,
    CommitError,
    CommitFenced,
    CommitLeaseLost,
    EoError,
)
from airflow_provider_eo.ledger import CheckpointState, Ledger, ShardState
from airflow_provider_eo.ledger.errors import CommitLeaseHeld, LedgerUnavailable
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
        self.cancelled: list[tuple[str, int]] = []

    def unavailable(self) -> str | None:
        return None

    def cancel(self, pipeline: str, checkpoint_id: int) -> None:
        self.cancelled.append((pipeline, checkpoint_id))

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


# -- a commit task that begins after an abort's fence ------------------------------------------


class LateTasksRunner(InProcessRunner):
    """Spark starts the commit tasks late (few cores, many shards): meanwhile the driver's
    lease lapsed and ``eo abort`` took the checkpoint over: fenced every shard, found no
    marker, ABORTED. Only then does each task run (its ``init_transactions`` after the
    abort's fence)."""

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        if self.ledger.get(self.pipeline.name, 1).state is CheckpointState.PREPARED:
            abort_checkpoint(
                self.pipeline, self.ledger, 1, reason="stuck commit", force_live=True, clients=self.clients
            )
        return super().run(tasks, on_outcome)


def test_a_task_that_begins_after_an_abort_publishes_nothing(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    runner = LateTasksRunner(clients, ledger, pipeline)
    error: BaseException | None = None
    try:
        commit_checkpoint(
            pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
        )
    except EoError as exc:
        error = exc
    # The abort's range is replanned: anything a late task publishes would appear twice.
    assert {p: broker.values(OUT, p) for p in range(SINK_PARTITIONS)} == {0: [], 1: [], 2: []}
    assert isinstance(error, CheckpointAborted), error
    assert "an abort of this checkpoint fenced transactional id 'eo.orders.0'" in str(error)
    assert "(in the commit task on " in str(error)
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.ABORTED
    assert broker.mark(pipeline.group_id, "in", 0) == -1
    # A Spark retry of the task (a later attempt, another executor) is refused the same way.
    task_attempt(1)
    c = _committable(pipeline, ledger, cp.checkpoint_id, 0)
    (retried,) = list(spark_commit.run_shard_task([ShardTask(c, row_before=True)], clients))
    assert isinstance(retried, ShardFailure) and retried.error == "CheckpointAborted"
    assert broker.values(OUT) == []


def _committable(pipeline: Pipeline, ledger: Ledger, checkpoint_id: int, shard: int) -> ShardCommittable:
    from airflow_provider_eo import staging
    from airflow_provider_eo.core.commit import shard_committable

    cp = ledger.get(pipeline.name, checkpoint_id)
    assert cp.commit_plan is not None
    manifest = staging.read_manifest(cp.staging_location or "")
    identity = ledger.get_pipeline(pipeline.name).identity
    return shard_committable(pipeline, identity, cp, manifest, cp.commit_plan, shard, topic_max_bytes=None)


def test_the_abort_marks_do_not_stop_the_replanned_checkpoint(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    """Checkpoint 1 aborted (marked), its range replanned as checkpoint 2: committed in spark
    mode once; a second abort adds its id to the marks, a commit moves every mark past."""
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    abort_checkpoint(pipeline, ledger, first.checkpoint_id, reason="bad staging", clients=clients)
    group = names.aborted_group(pipeline.name)
    identity = ledger.get_pipeline(pipeline.name).identity
    assert {s: broker.marks[(group, OUT, s)] for s in range(SHARDS)} == {
        s: (1, f"eoab1:{identity}:1") for s in range(SHARDS)
    }
    second = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    abort_checkpoint(pipeline, ledger, second.checkpoint_id, reason="bad staging", clients=clients)
    assert broker.marks[(group, OUT, 0)] == (2, f"eoab1:{identity}:1-2")
    third = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    runner = InProcessRunner(clients, ledger, pipeline)
    done = commit_checkpoint(
        pipeline, ledger, third.checkpoint_id, clients=clients, commit_mode="spark", runner=runner
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values
    # The next abort keeps only ids above the shard's marker (3): the older ones are moot.
    fourth = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS, start=10)
    abort_checkpoint(pipeline, ledger, fourth.checkpoint_id, reason="bad staging", clients=clients)
    assert broker.marks[(group, OUT, 0)] == (4, f"eoab1:{identity}:4")


def _before_mark_commit(broker: FakeBroker, transactional_id: str, then: Callable[[], None]) -> list[str]:
    """Run ``then`` once, when the abort's mark transaction of ``transactional_id`` is about to
    commit (the first commit_transaction of that id carrying an offset of the abort group)."""
    fired: list[str] = []

    def hook(producer: Any) -> None:
        if producer.transactional_id == transactional_id and not fired and producer.pending_marks:
            fired.append("fired")
            then()

    broker.on_call["commit_transaction"] = hook
    return fired


def test_a_task_that_publishes_while_the_abort_marks_makes_the_abort_refuse(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    """A late task runs its whole shard (the last, 2) between the abort's mark init and the
    mark's commit (its init fenced the abort's producer): the abort's redo reads the task's
    marker after its own init and refuses, taking back the marks it left on shards 0 and 1.
    Published once, never replanned; a retry of the commit (spark mode) finishes."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    c = _committable(pipeline, ledger, cp.checkpoint_id, 2)
    late: list[Publisher | ShardFailure] = []
    fired = _before_mark_commit(
        broker,
        c.transactional_id,
        lambda: late.extend(spark_commit.run_shard_task([ShardTask(c, row_before=False)], clients)),
    )
    with pytest.raises(AbortRefused, match=r"shard 2 was published \(its commit marker shows checkpoint 1\)"):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="stuck", clients=clients)
    assert fired and isinstance(late[0], Publisher) and not late[0].skipped
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED
    identity = ledger.get_pipeline(pipeline.name).identity
    group = names.aborted_group(pipeline.name)
    taken_back = (0, f"eoab1:{identity}:")  # no id left
    assert {s: broker.marks[(group, OUT, s)] for s in (0, 1)} == {0: taken_back, 1: taken_back}
    done = commit_checkpoint(
        pipeline,
        ledger,
        cp.checkpoint_id,
        clients=clients,
        commit_mode="spark",
        runner=InProcessRunner(clients, ledger, pipeline),
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values


def test_a_task_that_inits_while_the_abort_marks_is_fenced_by_the_abort_redo(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    """A late task's init_transactions falls between the abort's mark init and its commit,
    and it reads no mark (none committed yet), then pauses: the abort's mark commit fails
    fenced, its redo fences the task in turn and marks; the task's transaction never shows."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    c = _committable(pipeline, ledger, cp.checkpoint_id, 0)
    paused: list[Any] = []

    def task_inits() -> None:
        producer = clients.producer(c.transactional_id, 10_000, None, None)
        producer.init_transactions(10)
        spark_commit.refuse_if_aborted(c, clients)  # no mark yet: the task would go on
        paused.append(producer)

    fired = _before_mark_commit(broker, c.transactional_id, task_inits)
    done = abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="stuck", clients=clients)
    assert fired and done.state is CheckpointState.ABORTED
    identity = ledger.get_pipeline(pipeline.name).identity
    assert broker.marks[(names.aborted_group(pipeline.name), OUT, 0)] == (1, f"eoab1:{identity}:1")
    (task,) = paused
    with pytest.raises(KafkaException):  # the task goes on: fenced by the abort's redo
        task.begin_transaction()
        task.produce(OUT, b"late", None, 0)
        task.commit_transaction(10)
    assert broker.values(OUT) == []


# -- the driver's lease keeper --------------------------------------------------------------


class FlakyLedger:
    """A ledger whose lease renewals fail as told (``errors``: one per renewal, None lets it
    through; then ``after`` for every further one), everything else the real ledger's."""

    def __init__(
        self, ledger: Ledger, errors: list[BaseException | None], after: BaseException | None = None
    ):
        self.ledger = ledger
        self.errors = errors
        self.after = after
        self.renewals: list[float] = []

    def acquire_commit_lease(self, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float) -> Any:
        self.renewals.append(time.monotonic())
        error = self.errors.pop(0) if self.errors else self.after
        if error is not None:
            raise error
        return self.ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    wait_for(condition, what, timeout=timeout)


def _keeper(ledger: Any, ttl_s: float, cancelled: list[float]) -> _LeaseKeeper:
    keeper = _LeaseKeeper(
        ledger, "orders", 1, "driver", ttl_s, cancel=lambda: cancelled.append(time.monotonic())
    )
    keeper.start()
    return keeper


def test_the_keeper_rides_out_a_ledger_blip(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    ledger.acquire_commit_lease(pipeline.name, cp.checkpoint_id, owner="driver", ttl_s=30)
    blip = LedgerUnavailable("database is locked")
    flaky = FlakyLedger(ledger, [None, blip, blip, None, None])
    cancelled: list[float] = []
    keeper = _keeper(flaky, 1.2, cancelled)
    try:
        _wait_for(lambda: len(flaky.renewals) >= 5, "five renewals")
    finally:
        keeper.stop.set()
        keeper.join(5)
    assert keeper.lost is None and cancelled == []


def test_the_keeper_cancels_the_jobs_before_the_lease_lapses(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """The ledger stops answering: renewals are retried, sooner than every third of the lease,
    and the jobs are cancelled before the lease (taken when the keeper started) lapses."""
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    ttl = 1.2
    ledger.acquire_commit_lease(pipeline.name, cp.checkpoint_id, owner="driver", ttl_s=ttl)
    flaky = FlakyLedger(ledger, [], after=LedgerUnavailable("could not connect to server"))
    cancelled: list[float] = []
    taken = time.monotonic()
    keeper = _keeper(flaky, ttl, cancelled)
    try:
        _wait_for(lambda: bool(cancelled), "the jobs to be cancelled")
    finally:
        keeper.stop.set()
        keeper.join(5)
    assert cancelled[0] - taken < ttl  # before the lease lapsed
    assert len(flaky.renewals) >= 3  # retried, not given up at the first error
    assert keeper.lost is not None and "could not connect to server" in keeper.lost
    assert "the ledger did not answer" in keeper.lost


def test_the_keeper_cancels_at_once_when_the_lease_was_taken_over(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    ledger.acquire_commit_lease(pipeline.name, cp.checkpoint_id, owner="driver", ttl_s=30)
    held = CommitLeaseHeld("checkpoint 1 of pipeline 'orders' is being committed by 'fence:x'")
    flaky = FlakyLedger(ledger, [], after=held)
    cancelled: list[float] = []
    keeper = _keeper(flaky, 1.2, cancelled)
    try:
        _wait_for(lambda: bool(cancelled), "the jobs to be cancelled")
    finally:
        keeper.stop.set()
        keeper.join(5)
    assert len(flaky.renewals) == 1 and keeper.lost is not None and "fence:x" in keeper.lost


class CancellableRunner(InProcessRunner):
    """Its first phase runs until the commit's keeper cancels it (as Spark's cancelJobGroup
    fails the jobs of a group): the tasks never start."""

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        self.phases.append([t.committable.shard for t in tasks])
        _wait_for(lambda: bool(self.cancelled), "the keeper to cancel the jobs")
        return [
            (t.committable.shard, RuntimeError("Job 3 cancelled part of cancelled job group")) for t in tasks
        ]


def test_a_commit_that_loses_its_lease_cancels_its_jobs_and_never_starts_the_last_shard(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    from airflow_provider_eo.core import commit_on_spark as commit_module

    class QuickKeeper(_LeaseKeeper):  # the commit's lease lasts 1.2 s instead of 2 * timeout + 30
        def __init__(self, *args: Any, cancel: Callable[[], None]) -> None:
            super().__init__(*args[:4], 1.2, cancel=cancel)

    monkeypatch.setattr(commit_module, "_LeaseKeeper", QuickKeeper)
    flaky = FlakyLedger(ledger, [None], after=LedgerUnavailable("could not connect to server"))
    runner = CancellableRunner(clients, ledger, pipeline)
    with pytest.raises(
        CommitLeaseLost, match=r"checkpoint 1: this commit gave up its commit lease \(the ledger did"
    ):
        commit_checkpoint(
            pipeline,
            flaky,  # type: ignore[arg-type]
            cp.checkpoint_id,
            clients=clients,
            commit_mode="spark",
            runner=runner,
        )
    assert runner.phases == [[0, 1]] and runner.cancelled == [(pipeline.name, 1)]
    assert broker.values(OUT) == [] and broker.mark(pipeline.group_id, "in", 0) == -1
    assert ledger.get(pipeline.name, 1).state is CheckpointState.PREPARED


class PublishThenCancelRunner(InProcessRunner):
    """Its first phase's tasks publish, then the keeper's cancel arrives (it raced the tasks'
    commit_transaction and lost): Spark reports the jobs as they ended."""

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        out = super().run(tasks, on_outcome)
        _wait_for(lambda: bool(self.cancelled), "the keeper to cancel the jobs")
        return out


def test_a_cancel_that_comes_after_the_tasks_committed_loses_nothing_and_duplicates_nothing(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    from airflow_provider_eo.core import commit_on_spark as commit_module

    class QuickKeeper(_LeaseKeeper):
        def __init__(self, *args: Any, cancel: Callable[[], None]) -> None:
            super().__init__(*args[:4], 1.2, cancel=cancel)

    monkeypatch.setattr(commit_module, "_LeaseKeeper", QuickKeeper)
    flaky = FlakyLedger(ledger, [None], after=LedgerUnavailable("could not connect to server"))
    with pytest.raises(CommitLeaseLost, match=r"Shards committed: \[0, 1\]"):
        commit_checkpoint(
            pipeline,
            flaky,  # type: ignore[arg-type]
            cp.checkpoint_id,
            clients=clients,
            commit_mode="spark",
            runner=PublishThenCancelRunner(clients, ledger, pipeline),
        )
    # Shards 0 and 1 are published: an abort is refused, the retry skips them by their markers.
    with pytest.raises(AbortRefused):
        abort_checkpoint(pipeline, ledger, cp.checkpoint_id, reason="stuck", force_live=True, clients=clients)
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED
    done = commit_checkpoint(
        pipeline,
        ledger,
        cp.checkpoint_id,
        clients=clients,
        commit_mode="spark",
        runner=InProcessRunner(clients, ledger, pipeline),
    )
    assert done.checkpoint.state is CheckpointState.COMMITTED
    assert {p.shard: p.skipped for p in done.publishers} == {0: True, 1: True, 2: False}
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values


def test_marks_left_by_an_abort_that_died_before_the_ledger_refuse_spark_tasks_not_a_local_commit(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, task_attempt: Any
) -> None:
    """The abort left its marks and died before ``ledger.abort``: the checkpoint stays
    PREPARED. A spark-mode commit's tasks refuse it (naming the way out); a local commit,
    which takes the ledger's lease after fencing, finishes it once."""
    from airflow_provider_eo.core.abort_marks import mark_aborted

    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=SINK_PARTITIONS)
    clients = FakeClients(broker)
    identity = ledger.get_pipeline(pipeline.name).identity
    ids = [f"eo.orders.{s}" for s in range(SHARDS)]
    mark_aborted(pipeline, identity, cp, ids, renew=lambda: None, where="", clients=clients)
    with pytest.raises(
        CheckpointAborted, match=r"finish the checkpoint with `eo commit --commit-mode local`"
    ):
        commit_checkpoint(
            pipeline,
            ledger,
            cp.checkpoint_id,
            clients=clients,
            commit_mode="spark",
            runner=InProcessRunner(clients, ledger, pipeline),
        )
    assert broker.values(OUT) == []
    done = commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=clients, commit_mode="local")
    assert done.checkpoint.state is CheckpointState.COMMITTED
    for p, values in OUTPUT.items():
        assert broker.values(OUT, p) == values
