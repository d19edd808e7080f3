"""recover_pipeline (core/recover.py) on a real SQLite ledger and a fake Kafka: the PREPARED
checkpoint is committed by its markers, every other transactional id of the pipeline is
fenced (a zombie's open transaction aborted), and what stays open is reported."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

import pytest
from eo_fake_kafka import (
    FakeBroker,
    FakeClients,
    FakeProducer,
    prepared_checkpoint,
)

from airflow_provider_eo.core import shard as shard_module
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.recover import recover_pipeline
from airflow_provider_eo.core.shard import Publisher, ShardFailure, ShardTask
from airflow_provider_eo.errors import RecoverError
from airflow_provider_eo.kafka.publisher import ProducerLost
from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec, leases
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import commit as spark_commit

OUT = "out"
SHARDS = 3
SINK_PARTITIONS = 3
FIRST = {0: [b"a0"], 1: [b"b0"], 2: [b"c0"]}
SECOND = {0: [b"a1", b"a2"], 1: [b"b1"], 2: [b"c1"]}


class Crash(BaseException):
    """The committer process dies here."""


def zombie(clients: FakeClients, transactional_id: str, partition: int) -> FakeProducer:
    """A producer of ours that began a transaction and never finished it."""
    producer = clients.producer(transactional_id, 10_000, None, None)
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(OUT, b"zombie", None, partition)
    return producer


def test_commits_the_prepared_checkpoint_and_fences_the_other_ids(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, FIRST, sink_partitions=3)
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)  # ids .0 .1 .2
    narrow = dataclasses.replace(pipeline, commit_shards=2)  # checkpoint 2 commits with ids .0 .1
    second = prepared_checkpoint(ledger, narrow, SECOND, sink_partitions=3, start=10)
    stale = zombie(clients, "eo.orders.2", 2)  # a zombie of checkpoint 1's shard 2
    # checkpoint 2's committer died mid-produce, its transaction open
    monkeypatch.setattr(shard_module, "fault_point", lambda step: _raise(step == "commit.after_begin"))
    with pytest.raises(Crash):
        commit_checkpoint(narrow, ledger, second.checkpoint_id, clients=clients)
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    # the dead committer's lease runs out (recover refuses while it runs)
    real_now = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real_now(s) + dt.timedelta(minutes=10))

    lines: list[str] = []
    result = recover_pipeline(narrow, ledger, wait_s=0, progress=lines.append, clients=clients)
    assert result.open_before == {0: (1, 3), 2: (1, 2)}
    assert (result.committed, result.published) == (second.checkpoint_id, 4)
    assert result.fenced == ["eo.orders.2"]
    assert result.open_after == {} and result.clean
    assert ledger.get("orders", second.checkpoint_id).state is CheckpointState.COMMITTED
    for p in range(3):  # each record once; nothing of the zombie or the dead committer
        assert broker.values(OUT, p) == FIRST[p] + SECOND[p]
    assert not stale.pending
    assert lines == [
        "open transaction on out[0]: last stable offset 1 < high watermark 3",
        "open transaction on out[2]: last stable offset 1 < high watermark 2",
        f"checkpoint {second.checkpoint_id}: committed (4 records published, 0 shards already "
        "done by their markers)",
        "fenced eo.orders.2",
    ]


def _raise(crash: bool) -> None:
    if crash:
        raise Crash


def test_without_a_prepared_checkpoint_every_id_is_fenced(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    first = prepared_checkpoint(ledger, pipeline, FIRST, sink_partitions=3)
    commit_checkpoint(pipeline, ledger, first.checkpoint_id, clients=clients)
    planned = ledger.plan("orders", [RangeSpec("in", 0, 10, 20)])  # PLANNED: not committed by recover
    stale = zombie(clients, "eo.orders.1", 1)
    result = recover_pipeline(pipeline, ledger, wait_s=0, clients=clients)
    assert result.committed is None and result.published == 0
    assert result.fenced == ["eo.orders.0", "eo.orders.1", "eo.orders.2"]
    assert result.open_before == {1: (1, 2)} and result.clean
    assert not stale.pending and broker.values(OUT) == [b"a0", b"b0", b"c0"]
    assert ledger.get("orders", planned.checkpoint_id).state is CheckpointState.PLANNED


def test_an_open_transaction_that_is_not_ours_is_reported(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    clients.open[OUT] = {1: (4, 6)}
    result = recover_pipeline(pipeline, ledger, wait_s=0, clients=clients)
    assert result.open_after == {1: (4, 6)} and not result.clean
    assert result.summary()["open_after"] == {"1": [4, 6]}
    assert result.fenced == ["eo.orders.0", "eo.orders.1", "eo.orders.2"]  # today's ids


def test_an_id_that_cannot_be_fenced_fails_the_recovery(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    broker.fail("init_transactions", None, ProducerLost("no answer"))
    with pytest.raises(
        RecoverError, match=r"could not fence transactional id 'eo.orders.1'.*Retry `eo recover`"
    ):
        recover_pipeline(pipeline, ledger, wait_s=0, clients=FakeClients(broker))


# -- a spark-mode pipeline ------------------------------------------------------------------


class TaskRunner:
    """Runs each shard through spark/commit.py's task body, as a Spark task would (or says
    Spark cannot start: ``unavailable``)."""

    master = "spark://cluster:7077"
    session_running = True
    executors_elsewhere = True

    def __init__(self, clients: FakeClients, *, unavailable: str | None = None) -> None:
        self.clients = clients
        self.why = unavailable
        self.shards: list[int] = []

    def unavailable(self) -> str | None:
        return self.why

    def cancel(self, pipeline: str, checkpoint_id: int) -> None:
        raise AssertionError("no lease is lost here")

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        out: list[tuple[int, Publisher | ShardFailure | BaseException]] = []
        for task in tasks:
            (outcome,) = list(spark_commit.run_shard_task([task], self.clients))
            self.shards.append(task.committable.shard)
            out.append((task.committable.shard, outcome))
            on_outcome(outcome)
        return out


def _spark_checkpoint_whose_committer_died(
    pipeline: Pipeline, ledger: Ledger, clients: FakeClients, monkeypatch: pytest.MonkeyPatch
) -> Pipeline:
    """A ``commit_mode="spark"`` pipeline whose checkpoint 1 is PREPARED, shard 0 published,
    shard 1's committer killed inside its transaction, its lease run out."""
    spark = dataclasses.replace(pipeline, commit_mode="spark")
    cp = prepared_checkpoint(ledger, spark, SECOND, sink_partitions=3)
    hits: list[str] = []

    def second_begin(step: str) -> None:
        if step == "commit.after_begin":
            hits.append(step)
            _raise(len(hits) == 2)  # one call per sink partition: shard 1's

    monkeypatch.setattr(shard_module, "fault_point", second_begin)
    with pytest.raises(Crash):
        commit_checkpoint(spark, ledger, cp.checkpoint_id, clients=clients, commit_mode="local")
    monkeypatch.setattr(shard_module, "fault_point", lambda step: None)
    assert broker_values(clients) == [b"a1", b"a2"]
    real_now = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real_now(s) + dt.timedelta(minutes=10))
    monkeypatch.setattr(spark_commit, "_task_identity", lambda: ("7", 0))
    return spark


def broker_values(clients: FakeClients) -> list[bytes | None]:
    return clients.broker.values(OUT)


def test_recover_commits_a_spark_mode_checkpoint_through_the_runner(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = FakeClients(broker)
    spark = _spark_checkpoint_whose_committer_died(pipeline, ledger, clients, monkeypatch)
    runner = TaskRunner(clients)
    lines: list[str] = []
    result = recover_pipeline(spark, ledger, wait_s=0, progress=lines.append, clients=clients, runner=runner)
    assert (result.committed, result.published) == (1, 2) and result.clean
    assert runner.shards == [1, 2]  # in Spark tasks; shard 0 is recorded COMMITTED: never run again
    for p in range(3):  # each record once
        assert broker.values(OUT, p) == SECOND[p]
    assert not any("committing its shards in this process" in line for line in lines), lines


@pytest.mark.parametrize(
    ("has_runner", "why"),
    [
        (False, "this caller has no Spark shard runner"),
        (True, "Spark could not be started (JavaNotFound: no java)"),
    ],
)
def test_recover_commits_a_spark_mode_checkpoint_locally_where_spark_is_not_reachable(
    pipeline: Pipeline,
    ledger: Ledger,
    broker: FakeBroker,
    monkeypatch: pytest.MonkeyPatch,
    has_runner: bool,
    why: str,
) -> None:
    clients = FakeClients(broker)
    spark = _spark_checkpoint_whose_committer_died(pipeline, ledger, clients, monkeypatch)
    runner = TaskRunner(clients, unavailable=why) if has_runner else None
    lines: list[str] = []
    given = {"runner": runner} if runner is not None else {}  # the eo recover of before: none
    result = recover_pipeline(spark, ledger, wait_s=0, progress=lines.append, clients=clients, **given)
    assert (result.committed, result.published) == (1, 2) and result.clean
    assert runner is None or runner.shards == []
    for p in range(3):
        assert broker.values(OUT, p) == SECOND[p]
    assert (
        f"pipeline 'orders', checkpoint 1: commit_mode 'spark', but {why}: committing its shards in "
        "this process instead (both modes keep the same markers and ledger rows)"
    ) in lines
    assert ledger.get("orders", 1).state is CheckpointState.COMMITTED
