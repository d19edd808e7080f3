"""Checkpoint sizing (core/plan.py): plan keeps a checkpoint small enough that its commit's
shards publish well inside ``transaction.timeout.ms``, at the publish rate measured from the
pipeline's recent commits in the ledger.

The commits run for real (core/commit.py on a fake Kafka, a real SQLite ledger); only the
clocks are ours: every record produced moves them on by a fixed time, so the publish rate
the ledger shows is known exactly.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, FakeProducer, kafka_error, prepared_checkpoint

from airflow_provider_eo.core.commit import LedgerShardHooks, commit_checkpoint
from airflow_provider_eo.core.plan import (
    DEFAULT_PUBLISH_RATE,
    PUBLISH_TIMEOUT_SHARE,
    checkpoint_budget,
    measured_publish_rate,
    plan_checkpoint,
)
from airflow_provider_eo.core.stream import default_steps
from airflow_provider_eo.errors import CommitError
from airflow_provider_eo.ledger import Actor, CheckpointState, Ledger, events, leases, transitions
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 1
SINK_PARTITIONS = 1
TIMEOUT_S = 10.0  # fake_pipeline's transaction_timeout_ms


class Clock:
    """The ledger's clocks (the database's and the committer's) and the one the commit times
    its transactions with, moved by hand."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def __call__(self, *_session: Any) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(leases, "database_now", clock)
    for module in (leases, transitions, events):
        monkeypatch.setattr(module, "utcnow", clock)
    monkeypatch.setattr(LedgerShardHooks, "clock", staticmethod(lambda: clock.now.timestamp()))
    return clock


def publish_at(broker: FakeBroker, clock: Clock, seconds_per_record: float) -> None:
    def tick(producer: FakeProducer) -> None:
        clock.advance(seconds_per_record)

    broker.on_call["produce"] = tick


def committed(
    pipeline: Pipeline,
    ledger: Ledger,
    broker: FakeBroker,
    output: dict[int, list[bytes]],
    *,
    start: int = 0,
    read: int = 10,
    sink_partitions: int = SINK_PARTITIONS,
) -> None:
    """Plan, stage and commit one checkpoint reading ``read`` offsets of ``in[0]``."""
    cp = prepared_checkpoint(
        ledger, pipeline, output, sink_partitions=sink_partitions, start=start, read=read
    )
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))


def values(n: int) -> list[bytes]:
    return [f"v{i}".encode() for i in range(n)]


def test_nothing_measured_yet_uses_the_default_rate(pipeline: Pipeline, ledger: Ledger) -> None:
    budget = checkpoint_budget(pipeline, ledger)
    assert not budget.measured
    assert budget.offsets == int(DEFAULT_PUBLISH_RATE * TIMEOUT_S * PUBLISH_TIMEOUT_SHARE) == 25_000


def test_the_rate_is_measured_from_the_transactions_that_published(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    publish_at(broker, clock, 0.1)  # 10 records: the commit publishes for 1 s
    committed(pipeline, ledger, broker, {0: values(10)}, read=20)
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S)
    assert rate is not None and (rate.offsets_per_s, rate.largest_share, rate.samples) == (20.0, 1.0, 1)
    budget = checkpoint_budget(pipeline, ledger)
    assert budget.measured and budget.offsets == 20 * 5  # 20 offsets/s for half of 10 s


def test_the_median_of_recent_commits_ignores_one_slow_retry(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    publish_at(broker, clock, 0.1)
    committed(pipeline, ledger, broker, {0: values(10)}, start=0, read=10)  # 10 offsets/s
    publish_at(broker, clock, 1.0)
    committed(pipeline, ledger, broker, {0: values(10)}, start=10, read=10)  # 1 offset/s
    publish_at(broker, clock, 0.05)
    committed(pipeline, ledger, broker, {0: values(10)}, start=20, read=10)  # 20 offsets/s
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S)
    assert rate is not None and (rate.offsets_per_s, rate.samples) == (10.0, 3)


def test_only_the_latest_commits_count(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    publish_at(broker, clock, 1.0)
    committed(pipeline, ledger, broker, {0: values(10)}, start=0, read=10)  # 1 offset/s, old
    publish_at(broker, clock, 0.1)
    for i in range(1, 6):
        committed(pipeline, ledger, broker, {0: values(10)}, start=10 * i, read=10)
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S, samples=5)
    assert rate is not None and (rate.offsets_per_s, rate.samples) == (10.0, 5)


def test_an_aborted_round_before_the_one_that_published_does_not_count(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    """The first transaction is aborted and the broker takes five minutes to answer the
    abort (a broker dying meanwhile): the redo publishes 10 records in 1 s. The rate is the
    redo's, 20 offsets/s; timed from the first try's lease it would be 20 / 302 s, a budget
    of 1 offset."""
    publish_at(broker, clock, 0.1)
    broker.fail("commit_transaction", kafka_error(48, abortable=True))  # INVALID_TXN_STATE
    broker.on_call["abort_transaction"] = lambda producer: clock.advance(300)
    committed(pipeline, ledger, broker, {0: values(10)}, read=20)
    assert broker.count("abort_transaction") == 1
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S)
    assert rate is not None and rate.offsets_per_s == 20.0
    assert checkpoint_budget(pipeline, ledger).offsets == 100


def test_a_commit_that_failed_and_was_retried_later_counts_the_retry_only(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    publish_at(broker, clock, 0.1)
    broker.fail("commit_transaction", kafka_error(-150, fatal=True))  # _FATAL: the task fails
    cp = prepared_checkpoint(ledger, pipeline, {0: values(10)}, sink_partitions=SINK_PARTITIONS, read=20)
    with pytest.raises(CommitError):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    clock.advance(600)  # the task's retry, ten minutes later
    commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S)
    assert rate is not None and rate.offsets_per_s == 20.0


def test_a_publish_counts_at_most_the_transaction_timeout(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    """The floor: a transaction the broker let commit was open at most the timeout (10 s),
    so a publish timed at 100 s (a stalled ledger write around it) counts as 10 s, and the
    next checkpoint may plan half of this one's 20 offsets, not 1."""
    publish_at(broker, clock, 10.0)  # 10 records: 100 s
    committed(pipeline, ledger, broker, {0: values(10)}, read=20)
    rate = measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S)
    assert rate is not None and rate.offsets_per_s == 2.0
    assert checkpoint_budget(pipeline, ledger).offsets == 10


def test_a_shard_published_by_a_process_that_died_gives_no_sample(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, clock: Clock
) -> None:
    """Its marker shows the shard committed; the process that finishes the checkpoint did not
    time that transaction, so nothing is measured (the default rate stays)."""
    cp = prepared_checkpoint(ledger, pipeline, {0: values(10)}, sink_partitions=SINK_PARTITIONS, read=20)
    ledger.record_shard(
        "orders",
        cp.checkpoint_id,
        0,
        transactional_id="eo.orders.0",
        producer_id=None,
        producer_epoch=None,
        state="COMMITTED",
        records=10,
    )
    ledger.mark_committed("orders", cp.checkpoint_id)
    assert measured_publish_rate(ledger, "orders", timeout_s=TIMEOUT_S) is None
    assert not checkpoint_budget(pipeline, ledger).measured


def test_a_skewed_shard_shrinks_the_budget(
    tmp_path: Path, make_ledger: Any, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """Two shards, one getting 3 of 4 records: the budget keeps that shard inside the time."""
    from eo_fake_kafka import fake_pipeline, patched_broker

    pipeline = fake_pipeline(tmp_path, sink=OUT, shards=2)
    ledger = make_ledger(pipeline="orders")
    broker = patched_broker(monkeypatch, {OUT: 2})
    publish_at(broker, clock, 0.25)  # 4 records: 1 s
    committed(pipeline, ledger, broker, {0: values(3), 1: values(1)}, read=8, sink_partitions=2)
    budget = checkpoint_budget(pipeline, ledger)
    assert (budget.offsets_per_s, budget.largest_share) == (8.0, 0.75)
    assert budget.offsets == int(8.0 * 5 / 0.75)


def plan_next(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker | None, *, end: int) -> Any:
    """plan_checkpoint against a source ``in[0]`` that ends at ``end``, through the fake
    clients (the sink guard reads the fake broker's markers and output too)."""
    broker = broker or FakeBroker(partitions={OUT: SINK_PARTITIONS})
    broker.logs[("in", 0)] = (0, end)
    return plan_checkpoint(pipeline, ledger, clients=FakeClients(broker))


def planned_event(ledger: Ledger, checkpoint_id: int) -> Any:
    (event,) = [e for e in ledger.events("orders", checkpoint_id) if e.to_state is CheckpointState.PLANNED]
    return event


def test_plan_caps_the_next_checkpoint_to_the_measured_rate(
    pipeline: Pipeline, make_ledger: Any, broker: FakeBroker, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 offsets wait; the last commit published 20 offsets/s, so the next checkpoint
    plans 100 (its commit then takes about 5 s of the 10 s timeout), not 1,000 (50 s: the
    broker would abort its transaction every time)."""
    ledger = make_ledger(pipeline="orders", fingerprint=pipeline.fingerprint())
    publish_at(broker, clock, 0.1)
    committed(pipeline, ledger, broker, {0: values(10)}, read=20)
    cp = plan_next(pipeline, ledger, broker, end=1020)
    assert cp is not None and [(r.start, r.end) for r in cp.ranges] == [(20, 120)]
    sized = planned_event(ledger, cp.checkpoint_id).details["sized_to_transaction_timeout"]
    assert (sized["offsets"], sized["offsets_per_s"], sized["measured"]) == (100, 20.0, True)


def test_plan_is_unchanged_when_the_budget_is_larger(
    pipeline: Pipeline, make_ledger: Any, broker: FakeBroker, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger(pipeline="orders", fingerprint=pipeline.fingerprint())
    publish_at(broker, clock, 0.001)  # 20,000 offsets/s: 100,000 fit in 5 s
    committed(pipeline, ledger, broker, {0: values(10)}, read=20)
    cp = plan_next(pipeline, ledger, broker, end=1020)
    assert cp is not None and [(r.start, r.end) for r in cp.ranges] == [(20, 1020)]
    assert "sized_to_transaction_timeout" not in planned_event(ledger, cp.checkpoint_id).details


def test_the_first_checkpoint_is_sized_by_the_default_rate(
    pipeline: Pipeline, make_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger(pipeline="orders", fingerprint=pipeline.fingerprint())
    cp = plan_next(pipeline, ledger, None, end=90_000)
    assert cp is not None and [(r.start, r.end) for r in cp.ranges] == [(0, 25_000)]
    sized = planned_event(ledger, cp.checkpoint_id).details["sized_to_transaction_timeout"]
    assert sized["measured"] is False


@pytest.mark.parametrize(("end", "cut"), [(90_000, True), (1_000, False)])
def test_the_stream_plans_again_at_once_after_a_plan_cut_to_the_timeout(
    pipeline: Pipeline, make_ledger: Any, monkeypatch: pytest.MonkeyPatch, end: int, cut: bool
) -> None:
    """A plan cut below ``max_records_per_checkpoint`` by the budget leaves input waiting: the
    stream's ``full`` says so, so it plans the next checkpoint without waiting an interval."""
    ledger = make_ledger(pipeline="orders", fingerprint=pipeline.fingerprint())
    cp = plan_next(pipeline, ledger, None, end=end)
    assert cp is not None
    steps = default_steps(pipeline, ledger, stager=None, actor=Actor())  # type: ignore[arg-type]
    assert steps.full(cp) is cut
