"""Every branch of one shard's transaction (core/shard.py) against a fake Kafka.

Exactly-once is counted on what the fake broker's committed transactions hold (what a
``read_committed`` consumer would see), never on what the code says it did.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from eo_fake_kafka import FakeBroker, FakeClients, FakeProducer, kafka_error, make_committable

from airflow_provider_eo import names
from airflow_provider_eo.core import shard as shard_module
from airflow_provider_eo.core.shard import (
    MAX_SHARD_ROUNDS,
    Outcome,
    RealKafka,
    ShardCommittable,
    ShardTransaction,
    commit_shard,
    outcome_of,
)
from airflow_provider_eo.errors import (
    CommitAccessDenied,
    CommitError,
    CommitFenced,
    PipelineIdentityMismatch,
    TransactionalIdUnauthorized,
    TransactionTimedOut,
)
from airflow_provider_eo.kafka.publisher import Abortable, ProducerLost

IDENTITY = "0123456789abcdef"
SINK = "sink"
GROUP = "eo-markers"


class Hooks:
    """Records what the shard asks the ledger to record, in order."""

    def __init__(self, *, row: bool = False, broker: FakeBroker | None = None) -> None:
        self.row = row
        self.broker = broker
        self.events: list[tuple[str, int]] = []
        self.begun_before_pending = False

    def may_have_published(self) -> bool:
        return self.row

    def before_begin(self) -> None:
        self.row = True
        if self.broker is not None and self.broker.count("begin_transaction") > 0:
            self.begun_before_pending = True
        self.events.append(("PENDING", 0))

    def committed(self, records: int) -> None:
        self.events.append(("COMMITTED", records))


def committable(
    tmp_path: Path, *, checkpoint: int = 3, values: int = 5, last: bool = True
) -> ShardCommittable:
    root = tmp_path / f"cp{checkpoint}-{values}"
    return make_committable(root, [f"v{i}".encode() for i in range(values)], checkpoint=checkpoint, last=last)


def values(broker: FakeBroker) -> list[bytes | None]:
    return [r.value for r in broker.committed if r.topic == SINK]


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker(partitions={SINK: 1})


def test_publishes_once_with_marker_group_offsets_and_provenance(tmp_path: Path, broker: FakeBroker) -> None:
    hooks = Hooks(broker=broker)
    result = commit_shard(committable(tmp_path), hooks, FakeClients(broker))
    assert not hooks.begun_before_pending
    assert (result.records, result.skipped, result.rounds) == (5, False, 1)
    assert values(broker) == [f"v{i}".encode() for i in range(5)]
    assert broker.mark(GROUP, SINK, 0) == 3
    assert broker.marks[(GROUP, SINK, 0)][1] == names.marker_metadata(IDENTITY)
    assert broker.mark("orders-group", "src", 0) == 42
    assert broker.committed[0].checkpoint == (3, IDENTITY[: names.PROVENANCE_IDENTITY_CHARS])
    # the PENDING row exists before the transaction begins
    assert hooks.events == [("PENDING", 0), ("COMMITTED", 5)]
    assert broker.calls.index(("eo.orders.0", "begin_transaction")) > broker.calls.index(
        ("eo.orders.0", "init_transactions")
    )


def test_not_last_shard_leaves_the_group_alone(tmp_path: Path, broker: FakeBroker) -> None:
    commit_shard(committable(tmp_path, last=False), Hooks(), FakeClients(broker))
    assert broker.mark("orders-group", "src", 0) == -1
    assert broker.mark(GROUP, SINK, 0) == 3


def test_committable_is_picklable(tmp_path: Path) -> None:
    c = committable(tmp_path)
    assert pickle.loads(pickle.dumps(c)) == c


def test_marker_ahead_skips_without_producing(tmp_path: Path, broker: FakeBroker) -> None:
    broker.marks[(GROUP, SINK, 0)] = (3, names.marker_metadata(IDENTITY))
    hooks = Hooks()
    result = commit_shard(committable(tmp_path), hooks, FakeClients(broker))
    assert result.skipped and result.records == 0
    assert values(broker) == []
    assert broker.count("begin_transaction") == 0
    assert hooks.events == [("COMMITTED", 5)]


def test_marker_behind_publishes(tmp_path: Path, broker: FakeBroker) -> None:
    broker.marks[(GROUP, SINK, 0)] = (2, names.marker_metadata(IDENTITY))
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert not result.skipped and len(values(broker)) == 5


def test_foreign_marker_is_refused_before_anything_is_produced(tmp_path: Path, broker: FakeBroker) -> None:
    broker.marks[(GROUP, SINK, 0)] = (1, names.marker_metadata("ffffffffffffffff"))
    with pytest.raises(PipelineIdentityMismatch, match="another ledger"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("begin_transaction") == 0 and values(broker) == []


def test_ambiguous_commit_that_committed_is_decided_by_the_marker(tmp_path: Path, broker: FakeBroker) -> None:
    """The answer to commit_transaction is lost after the broker committed: the next round's
    fresh producer re-inits, the marker shows the checkpoint, nothing is sent twice."""

    def commit_then_lose(producer: FakeProducer) -> None:
        del broker.on_call["commit_transaction"]
        producer.commit_transaction(10)
        raise ProducerLost("the answer was lost")

    broker.on_call["commit_transaction"] = commit_then_lose
    hooks = Hooks()
    result = commit_shard(committable(tmp_path), hooks, FakeClients(broker))
    assert result.skipped and result.rounds == 2
    assert len(values(broker)) == 5  # exactly once
    assert broker.count("abort_transaction") == 0  # never an abort after an ambiguous commit
    assert hooks.events[-1] == ("COMMITTED", 5)


def test_ambiguous_commit_that_did_not_commit_is_redone(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("commit_transaction", ProducerLost("timed out before it was sent"))
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert not result.skipped and result.rounds == 2
    assert len(values(broker)) == 5
    assert broker.count("abort_transaction") == 0


def _after_the_timed_out_commit(broker: FakeBroker) -> list[str]:
    """The calls that followed the first ``commit_transaction``, up to the next marker read."""
    calls = [call for _tid, call in broker.calls]
    start = calls.index("commit_transaction") + 1
    end = calls.index("committed_marks", start) + 1
    return calls[start:end]


TIMED_OUT = KafkaError._TIMED_OUT


@pytest.mark.parametrize("committed", [True, False], ids=["it-committed", "it-did-not"])
@pytest.mark.parametrize("kept", [False, True], ids=["fresh-producer", "kept-producer"])
def test_a_timed_out_commit_drops_the_producer_and_a_new_one_inits_before_the_marker_decides(
    committed: bool, kept: bool, tmp_path: Path, broker: FakeBroker
) -> None:
    """``commit_transaction`` times out (librdkafka: retriable ``_TIMED_OUT``; its EndTxn may
    still land: librdkafka has no KIP-890 epoch bump per transaction). The producer is done
    for: never asked to commit again, never aborted, never kept; the next steps are a new
    producer, ``init_transactions`` (its epoch bump fences any late request of the old one),
    then the marker read, in that order, and the marker decides: skipped when the broker
    had committed, published once when it had not. With a kept producer (a stream's: the
    id's previous checkpoint committed cleanly in this process) the same."""
    from airflow_provider_eo.kafka.publisher import ProducerPool

    pool = ProducerPool() if kept else None
    clients = FakeClients(broker)
    if kept:  # the id's previous checkpoint, committed cleanly: its producer is kept
        commit_shard(committable(tmp_path, checkpoint=2, values=2), Hooks(), clients, pool=pool)
        assert pool is not None and len(pool) == 1
        broker.calls.clear()
    first_producers = len(broker.producers)

    def commit_then_time_out(producer: FakeProducer) -> None:
        del broker.on_call["commit_transaction"]
        if committed:  # the broker got the EndTxn and committed; the answer came too late
            producer.commit_transaction(10)
            broker.calls.pop()  # the broker's side of the call being answered, not a second call
        raise kafka_error(TIMED_OUT, retriable=True)

    broker.on_call["commit_transaction"] = commit_then_time_out
    hooks = Hooks()
    result = commit_shard(committable(tmp_path), hooks, clients, pool=pool)
    assert _after_the_timed_out_commit(broker) == [
        "new_producer",
        "metadata",
        "metadata",
        "init_transactions",
        "committed_marks",
    ]
    timed_out = broker.producers[first_producers - 1] if kept else broker.producers[0]
    # the timed-out one, then (not committed) the new producer's: never twice on one producer
    assert broker.count("commit_transaction") == (1 if committed else 2)
    assert broker.count("abort_transaction") == 0  # never an abort after an ambiguous commit
    assert result.skipped is committed and result.rounds == 2
    assert values(broker)[-5:] == [f"v{i}".encode() for i in range(5)]
    assert len(values(broker)) == (7 if kept else 5)  # each record once
    assert hooks.events[-1] == ("COMMITTED", 5)
    if pool is not None:  # the kept producer that timed out was not given back
        assert all(entry.producer is not timed_out for entry in pool._idle.values())


@pytest.mark.parametrize("flagged", [True, False], ids=["fatal-flag", "code-only"])
def test_a_fenced_commit_is_an_answer_not_an_unknown_outcome(
    flagged: bool, tmp_path: Path, broker: FakeBroker
) -> None:
    """A fence answered to commit_transaction (another committer took the id over) fails
    the shard as before: no new producer, whose init_transactions would fence the other
    committer in turn; the fatal flag is not needed (confluent-kafka does not always set it)."""
    broker.fail("commit_transaction", kafka_error(KafkaError._FENCED, fatal=flagged))
    with pytest.raises(CommitFenced):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("init_transactions") == 1 and broker.count("abort_transaction") == 0


def test_retriable_error_repeats_the_call(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail(
        "send_offsets_to_transaction", kafka_error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True)
    )
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert result.rounds == 1  # repeated in place, not a new round
    assert len(values(broker)) == 5
    assert broker.count("send_offsets_to_transaction") == 3  # marker (failed, repeated) + group


def test_abortable_error_aborts_and_redoes_the_shard(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("commit_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, abortable=True))
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert result.rounds == 2
    assert broker.count("abort_transaction") == 1
    assert values(broker) == [f"v{i}".encode() for i in range(5)]  # not duplicated


def test_transient_delivery_failure_aborts_and_redoes(tmp_path: Path, broker: FakeBroker) -> None:
    broker.refuse[(SINK, 0)] = KafkaError.NOT_ENOUGH_REPLICAS
    clients = FakeClients(broker)

    def heal(producer: object) -> None:
        broker.refuse.clear()  # the broker answers again for the redo

    broker.on_call["abort_transaction"] = heal
    result = commit_shard(committable(tmp_path), Hooks(), clients)
    assert result.rounds == 2
    assert values(broker) == [f"v{i}".encode() for i in range(5)]


def test_permanent_refusal_names_the_record_and_does_not_loop(tmp_path: Path, broker: FakeBroker) -> None:
    broker.refuse[(SINK, 0)] = KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(CommitError, match="refuses this record every time"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("begin_transaction") == 1  # one round, no redo loop
    assert broker.count("abort_transaction") == 1
    assert values(broker) == []


def test_permanent_refusal_message(tmp_path: Path, broker: FakeBroker) -> None:
    broker.refuse[(SINK, 0)] = KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(CommitError) as info:
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    text = str(info.value)
    assert "pipeline 'orders', checkpoint 3, shard 0" in text
    assert "largest record of sink partition 0" in text and "source src:0:" in text


def test_fenced_producer_fails_and_publishes_nothing(tmp_path: Path, broker: FakeBroker) -> None:
    def zombie_takes_over(producer: object) -> None:
        broker.epochs["eo.orders.0"] += 1  # another committer's init_transactions

    broker.on_call["send_offsets_to_transaction"] = zombie_takes_over
    with pytest.raises(CommitFenced, match="Another committer"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert values(broker) == [] and broker.mark(GROUP, SINK, 0) == -1


def test_rounds_run_out(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("commit_transaction", *[ProducerLost("lost")] * MAX_SHARD_ROUNDS)
    with pytest.raises(CommitError, match=f"after {MAX_SHARD_ROUNDS} rounds"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert values(broker) == []


def test_missing_marker_without_a_row_publishes(tmp_path: Path, broker: FakeBroker) -> None:
    """No marker and no shard row: no transaction was ever begun, nothing is read back."""
    result = commit_shard(committable(tmp_path), Hooks(row=False), FakeClients(broker))
    assert not result.skipped and len(values(broker)) == 5


def test_missing_marker_with_a_row_reads_the_output_back(tmp_path: Path, broker: FakeBroker) -> None:
    """The marker expired after a commit whose ledger update was lost: the committed output
    proves it, nothing is republished."""
    commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    broker.marks.clear()  # offsets.retention.minutes passed
    result = commit_shard(committable(tmp_path), Hooks(row=True), FakeClients(broker))
    assert result.skipped
    assert len(values(broker)) == 5


def test_outcome_ladder() -> None:
    assert outcome_of(Abortable("x")) is Outcome.ABORTABLE
    assert outcome_of(ProducerLost("x")) is Outcome.AMBIGUOUS
    assert outcome_of(CommitFenced("x")) is Outcome.PERMANENT
    assert outcome_of(CommitError("x")) is Outcome.PERMANENT


def test_the_real_clients_are_picklable_and_equal_by_their_config() -> None:
    """Spark ships them to executors with a shard; equal ones share idle producers."""
    clients = RealKafka.of({"bootstrap.servers": "127.0.0.1:9092"})
    copy = pickle.loads(pickle.dumps(clients))
    assert copy == clients and hash(copy) == hash(clients)
    assert copy.config["bootstrap.servers"] == "127.0.0.1:9092"
    assert clients != RealKafka.of({"bootstrap.servers": "127.0.0.1:9093"})


def test_the_steps_one_by_one(tmp_path: Path, broker: FakeBroker) -> None:
    c = committable(tmp_path)
    txn = ShardTransaction(c, FakeClients(broker))
    txn.fence()
    assert txn.committed_through(Hooks()) == -1
    assert txn.publish((p, c.batches(p)) for p in c.partitions) == 5
    assert values(broker) == []  # not visible before the commit
    txn.seal()
    txn.commit()
    assert len(values(broker)) == 5 and broker.mark(GROUP, SINK, 0) == 3
    assert ShardTransaction(c, FakeClients(broker)).marker() == 3


def test_a_lost_producer_at_init_starts_a_new_round(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("init_transactions", ProducerLost("init_transactions kept failing with a retriable error"))
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert result.rounds == 2 and len(values(broker)) == 5


def test_an_unclassified_error_fails_without_a_redo(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("begin_transaction", kafka_error(KafkaError.UNKNOWN))
    with pytest.raises(CommitError, match="unclassified Kafka error"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("init_transactions") == 1 and values(broker) == []


def test_an_unauthorized_transactional_id_fails(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("init_transactions", kafka_error(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    refused = r"WRITE on transactional-id 'eo\.orders\.'"
    with pytest.raises(TransactionalIdUnauthorized, match=refused) as caught:
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert "--operation Write --transactional-id eo.orders. --resource-pattern-type prefixed" in str(
        caught.value
    )
    assert broker.count("begin_transaction") == 0 and broker.count("init_transactions") == 1


def test_a_refused_group_fails_without_a_redo(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail(
        "send_offsets_to_transaction", kafka_error(KafkaError.GROUP_AUTHORIZATION_FAILED, abortable=True)
    )
    with pytest.raises(CommitAccessDenied, match=f"READ on group '{GROUP}'"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("init_transactions") == 1 and values(broker) == []


def test_a_failing_abort_still_redoes_the_shard(tmp_path: Path, broker: FakeBroker) -> None:
    """The abort is best effort: the next round's init_transactions aborts the transaction."""
    broker.fail("commit_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, abortable=True))
    broker.fail("abort_transaction", kafka_error(KafkaError._TIMED_OUT))
    result = commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert result.rounds == 2 and values(broker) == [f"v{i}".encode() for i in range(5)]


def test_rounds_of_abortable_errors_run_out_naming_the_last(tmp_path: Path, broker: FakeBroker) -> None:
    abortable = kafka_error(KafkaError.INVALID_TXN_STATE, abortable=True)
    broker.fail("commit_transaction", *[abortable] * MAX_SHARD_ROUNDS)
    with pytest.raises(
        CommitError, match=r"after 5 rounds .*\(last: commit_transaction: .*INVALID_TXN_STATE"
    ):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("abort_transaction") == MAX_SHARD_ROUNDS and values(broker) == []


def test_a_transaction_refused_write_on_its_topic_fails_at_once_naming_it(
    tmp_path: Path, broker: FakeBroker
) -> None:
    """An ACL refusing WRITE on the sink can fail the transaction as a whole
    (AddPartitionsToTxn) before any record is refused: no delivery report says why, the
    broker's authorized operations do. One round, not five of the same failure."""
    broker.fail("commit_transaction", *[kafka_error(KafkaError._STATE, abortable=True)] * MAX_SHARD_ROUNDS)
    clients = FakeClients(broker)
    clients.write_denied = {SINK}
    with pytest.raises(CommitAccessDenied, match=rf"WRITE.*{SINK}"):
        commit_shard(committable(tmp_path), Hooks(), clients)
    assert broker.count("abort_transaction") == 1 and values(broker) == []


def test_an_abortable_round_with_write_allowed_is_redone(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("commit_transaction", kafka_error(KafkaError._STATE, abortable=True))
    clients = FakeClients(broker)
    result = commit_shard(committable(tmp_path), Hooks(), clients)
    assert result.rounds == 2 and clients.write_checks == 1
    assert values(broker) == [f"v{i}".encode() for i in range(5)]


def test_missing_marker_and_nothing_staged_needs_no_proof(tmp_path: Path, broker: FakeBroker) -> None:
    """A shard row exists but the checkpoint has no record for the shard: nothing is read
    back; the redo publishes zero records and the same marker."""
    result = commit_shard(committable(tmp_path, values=0), Hooks(row=True), FakeClients(broker))
    assert broker.count("read_back") == 0
    assert (result.records, result.skipped) == (0, False) and broker.mark(GROUP, SINK, 0) == 3


class FakeClock:
    """The shard's monotonic clock, moved by hand (a publish that takes ``seconds``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fenced_while_serving_reports() -> SystemError:
    """What confluent-kafka raises from ``flush()`` when the broker fenced the producer while
    delivery reports were served: the fatal error is set, the ``on_delivery`` callback's first
    C call turns it into a SystemError caused by it."""
    fatal = kafka_error(KafkaError._FENCED, fatal=True)
    try:
        raise SystemError(
            "<method 'code' of 'KafkaError' objects> returned a result with an exception set"
        ) from fatal
    except SystemError as exc:
        return exc


def publish_takes(broker: FakeBroker, clock: FakeClock, seconds: float) -> None:
    """Each produce moves the clock on, so the whole publish takes ``seconds`` (5 records)."""

    def tick(producer: FakeProducer) -> None:
        clock.now += seconds / 5

    broker.on_call["produce"] = tick


def test_a_transaction_the_broker_timed_out_fails_by_name_and_is_not_redone(
    tmp_path: Path, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publish outlives transaction.timeout.ms (10 s here): the broker aborts the
    transaction and fences the producer. The error says so, with the numbers, instead of
    blaming another committer, and the shard is not redone at the same size."""
    clock = FakeClock()
    monkeypatch.setattr(shard_module, "monotonic", clock)
    publish_takes(broker, clock, 12.5)
    broker.fail("flush", fenced_while_serving_reports())
    with pytest.raises(TransactionTimedOut) as info:
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    text = str(info.value)
    assert "pipeline 'orders', checkpoint 3, shard 0" in text
    assert "'eo.orders.0' was open 12.5 s" in text and "transaction.timeout.ms (10000 ms)" in text
    assert "5 of the shard's 5 records" in text and "(0.4 records/s" in text
    assert "transaction_timeout_ms" in text and "transaction.max.timeout.ms" in text
    assert "max_records_per_checkpoint" in text and "eo abort MODULE:ATTR 3" in text
    assert "_FENCED" in text  # the broker's own words stay in the message
    assert broker.count("begin_transaction") == 1  # no redo of the same size
    assert values(broker) == [] and broker.mark(GROUP, SINK, 0) == -1


def test_an_abortable_failure_after_the_timeout_is_the_timeout(
    tmp_path: Path, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(shard_module, "monotonic", clock)
    publish_takes(broker, clock, 10.0)
    broker.fail("commit_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, abortable=True))
    with pytest.raises(TransactionTimedOut, match=r"was open 10\.0 s"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("begin_transaction") == 1 and broker.count("abort_transaction") == 1
    assert values(broker) == []


def test_a_produce_refused_as_fatal_after_the_timeout_is_the_timeout(
    tmp_path: Path, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fatal error can also reach a later produce() as _FATAL ("Unable to produce
    message: Local: Fatal error"), without the fatal flag: it is sorted as fatal too."""
    clock = FakeClock()
    monkeypatch.setattr(shard_module, "monotonic", clock)
    publish_takes(broker, clock, 12.5)
    broker.fail("produce", None, None, None, kafka_error(KafkaError._FATAL))
    with pytest.raises(TransactionTimedOut, match="_FATAL"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert broker.count("begin_transaction") == 1 and values(broker) == []


def test_a_fence_before_the_timeout_is_another_committer(
    tmp_path: Path, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fenced 2 s into a 10 s transaction: the broker's timeout cannot be the cause."""
    clock = FakeClock()
    monkeypatch.setattr(shard_module, "monotonic", clock)
    publish_takes(broker, clock, 2.0)
    broker.fail("flush", fenced_while_serving_reports())
    with pytest.raises(CommitFenced, match="Another committer") as info:
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
    assert not isinstance(info.value, TransactionTimedOut)
    assert values(broker) == []


def test_a_fatal_error_raised_while_serving_delivery_reports_is_sorted(
    tmp_path: Path, broker: FakeBroker
) -> None:
    """poll()/flush() surface a fatal error as a SystemError caused by it: it is sorted like
    the Kafka error it is, never passed on as a SystemError."""
    broker.fail("flush", fenced_while_serving_reports())
    with pytest.raises(CommitFenced):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))


def test_an_unrelated_system_error_is_not_taken_for_kafka(tmp_path: Path, broker: FakeBroker) -> None:
    broker.fail("flush", SystemError("a bug"))
    with pytest.raises(SystemError, match="a bug"):
        commit_shard(committable(tmp_path), Hooks(), FakeClients(broker))
