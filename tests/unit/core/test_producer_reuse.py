"""A shard's producer kept between clean commits in one process (core/shard.py with
kafka/publisher.py's ProducerPool), and the ledger calls of a small commit (core/commit.py),
against a fake Kafka and a real SQLite ledger.

What must hold: a producer is used again only after a clean ``commit_transaction`` of the
same transactional id; any failure drops it and the next round (or commit) starts with a new
producer and ``init_transactions``; a kept producer another process fenced meanwhile redoes
its round with a new one and publishes nothing twice; a producer never crosses a fork.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from eo_fake_kafka import (
    FakeBroker,
    FakeClients,
    FakeProducer,
    fire_once,
    kafka_error,
    make_committable,
    prepared_checkpoint,
)

from airflow_provider_eo.core import shard as shard_module
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.fencing import fence_id
from airflow_provider_eo.core.shard import commit_shard, pool_key
from airflow_provider_eo.errors import CommitError, CommitFenced, KafkaAdminError
from airflow_provider_eo.kafka import producer_pool, publisher
from airflow_provider_eo.kafka.publisher import PRODUCERS, DeliveryFailures, ProducerPool
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 1
SINK_PARTITIONS = 2
TID = "eo.orders.0"


def output(checkpoint: int) -> dict[int, list[bytes]]:
    return {0: [f"c{checkpoint}-a".encode()], 1: [f"c{checkpoint}-b".encode(), f"c{checkpoint}-c".encode()]}


@pytest.fixture(autouse=True)
def empty_pool() -> Iterator[None]:
    PRODUCERS.close()
    yield
    PRODUCERS.close()


def prepare(ledger: Ledger, pipeline: Pipeline, n: int) -> int:
    """Checkpoint ``n`` (1-based) prepared with :func:`output`; returns its id."""
    cp = prepared_checkpoint(ledger, pipeline, output(n), sink_partitions=SINK_PARTITIONS, start=10 * (n - 1))
    return cp.checkpoint_id


def commit(pipeline: Pipeline, ledger: Ledger, clients: FakeClients, n: int) -> None:
    cid = prepare(ledger, pipeline, n)
    result = commit_checkpoint(pipeline, ledger, cid, clients=clients)
    assert result.checkpoint.state is CheckpointState.COMMITTED


def published_once(broker: FakeBroker, checkpoints: int) -> None:
    """Every checkpoint's records are visible exactly once, in order."""
    for p in range(SINK_PARTITIONS):
        assert broker.values(OUT, p) == [v for n in range(1, checkpoints + 1) for v in output(n)[p]]


def kept(clients: FakeClients) -> list[Any]:
    """The producers the pool holds for ``clients`` (keys: pool_key)."""
    return [entry.producer for key, entry in PRODUCERS._idle.items() if key[0] is clients]


def test_a_clean_commit_keeps_the_producer_for_the_next_checkpoint(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    for n in (1, 2, 3):
        commit(pipeline, ledger, clients, n)
    published_once(broker, 3)
    # One producer and one init_transactions for three checkpoints ...
    assert broker.count("new_producer", TID) == 1
    assert broker.count("init_transactions", TID) == 1
    assert broker.count("commit_transaction", TID) == 3
    # ... and the marker read on every commit (it decides what is published).
    assert broker.count("committed_marks") >= 3
    assert kept(clients) == [broker.producers[0]]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("flush", kafka_error(KafkaError._TIMED_OUT, abortable=True)),  # abortable: aborted, redone
        ("commit_transaction", kafka_error(KafkaError._TIMED_OUT, abortable=True)),
        ("send_offsets_to_transaction", kafka_error(KafkaError._TIMED_OUT, abortable=True)),
    ],
)
def test_a_producer_that_aborted_is_never_used_again(
    call: str, error: BaseException, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    first = broker.producers[0]
    broker.fail(call, error)
    commit(pipeline, ledger, clients, 2)  # round 1 on the kept producer fails and aborts
    assert broker.count("abort_transaction", TID) == 1
    # The round after the abort ran on a new producer with its own init_transactions; the
    # aborted one made no call after its abort, and is not what the pool holds now.
    assert broker.count("new_producer", TID) == 2 and broker.count("init_transactions", TID) == 2
    after_abort = broker.calls[broker.calls.index((TID, "abort_transaction")) + 1 :]
    assert after_abort[0] == (TID, "new_producer")
    assert kept(clients) == [broker.producers[1]] and kept(clients)[0] is not first
    commit(pipeline, ledger, clients, 3)
    assert broker.count("new_producer", TID) == 2  # the clean one is kept again
    published_once(broker, 3)


@pytest.mark.parametrize("step", ["commit.ambiguous_before", "commit.ambiguous_after"])
def test_an_ambiguous_commit_drops_the_producer(
    step: str, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    triggered, fired = fire_once(step)

    monkeypatch.setattr(shard_module, "fault_triggered", triggered)
    commit(pipeline, ledger, clients, 2)
    assert fired and broker.count("abort_transaction") == 0  # never aborted: the marker decides
    assert broker.count("init_transactions", TID) == 2  # re-init with a new producer
    # ambiguous_after: the new producer found the marker and sent nothing (not kept: only a
    # producer that committed is); ambiguous_before: it committed and is kept.
    assert kept(clients) == ([] if step == "commit.ambiguous_after" else [broker.producers[1]])
    commit(pipeline, ledger, clients, 3)
    published_once(broker, 3)


def test_a_failure_after_the_commit_drops_the_producer_too(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything raised in the round (here the ledger's COMMITTED row) drops the producer,
    although its transaction committed."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    cid = prepare(ledger, pipeline, 2)
    real = ledger.record_shard

    def record_shard(*args: Any, **kwargs: Any) -> None:
        if kwargs["state"] == "COMMITTED":
            raise OSError("the ledger went away")
        real(*args, **kwargs)

    monkeypatch.setattr(ledger, "record_shard", record_shard)
    with pytest.raises(OSError):
        commit_checkpoint(pipeline, ledger, cid, clients=clients)
    assert kept(clients) == []
    created = broker.count("new_producer", TID)
    monkeypatch.setattr(ledger, "record_shard", real)
    commit_checkpoint(pipeline, ledger, cid, clients=clients)  # the retry: the marker shows it
    assert broker.count("new_producer", TID) == created + 1
    published_once(broker, 2)


def test_a_kept_producer_fenced_by_another_process_redoes_the_round_with_a_new_one(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Another process inits the same transactional id between two commits (an ``eo commit``
    elsewhere, a restarted stream) and leaves a transaction open: the kept producer is
    fenced at its first call; the round is redone with a new producer whose
    init_transactions aborts the other's transaction. Each record once, nothing of the
    other's visible."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    other = FakeClients(broker).producer(TID, 10_000, None, None)
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(OUT, value=b"zombie", partition=0)
    commit(pipeline, ledger, clients, 2)
    published_once(broker, 2)
    assert b"zombie" not in broker.values(OUT)
    assert broker.count("new_producer", TID) == 3  # ours, the other's, ours again
    with pytest.raises(KafkaException, match="_FENCED"):
        other.commit_transaction(10)  # the other one is fenced now
    assert kept(clients) == [broker.producers[2]]


def test_a_fence_of_a_fresh_producer_still_fails_the_commit(
    tmp_path: Path, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a kept producer's fence is redone: a fresh producer fenced mid-transaction means
    another committer is running now, and the shard fails as before."""
    broker.partitions["sink"] = 1
    c = make_committable(tmp_path / "a", [b"x"])

    def fence_it(producer: FakeProducer) -> None:
        FakeClients(broker).producer(c.transactional_id, 10_000, None, None).init_transactions(10)

    broker.on_call["flush"] = fence_it

    class Hooks:
        def may_have_published(self) -> bool:
            return False

        def before_begin(self) -> None:
            pass

        def committed(self, records: int) -> None:
            pass

    with pytest.raises(CommitFenced):
        commit_shard(c, Hooks(), FakeClients(broker), pool=PRODUCERS)
    assert broker.committed == []


def test_a_producer_never_crosses_a_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = ProducerPool()
    broker = FakeBroker()
    producer = FakeProducer(broker, TID, None)
    pool.give("key", producer, publisher.DeliveryFailures())
    monkeypatch.setattr(producer_pool.os, "getpid", lambda: -1)  # now "in a child"
    assert pool.take("key") is None
    assert not producer.closed  # the parent's: neither used nor destroyed here
    pool.give("key", producer, publisher.DeliveryFailures())
    pool.forget_inherited()  # what the fork hook does in the child
    assert len(pool) == 0 and pool.close() == 0 and not producer.closed


def test_the_pool_key_holds_the_process_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = make_committable(tmp_path, [b"x"])
    clients = FakeClients(FakeBroker())
    here = pool_key(c, clients)
    monkeypatch.setattr(shard_module.os, "getpid", lambda: -1)
    assert pool_key(c, clients) != here


def test_idle_producers_expire_and_the_pool_is_bounded() -> None:
    broker = FakeBroker()
    producers = [FakeProducer(broker, f"t{i}", None) for i in range(3)]
    pool = ProducerPool(max_idle=2, max_idle_s=300)
    for i, p in enumerate(producers):
        pool.give(i, p, publisher.DeliveryFailures())
    assert producers[0].closed and len(pool) == 2  # the least recently used went
    assert pool.take(1) is not None and pool.take(1) is None  # taken out while in use
    pool.max_idle_s = 0
    assert pool.take(2) is None and producers[2].closed


def test_a_producer_with_a_failed_delivery_is_not_kept() -> None:
    broker = FakeBroker()
    producer = FakeProducer(broker, TID, None)
    failures = publisher.DeliveryFailures()
    failures.count = 1
    pool = ProducerPool()
    pool.give("key", producer, failures)
    assert len(pool) == 0 and producer.closed


def test_close_producers_closes_the_idle_ones(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    assert publisher.close_producers() == 1
    assert broker.producers[0].closed
    commit(pipeline, ledger, clients, 2)  # a new producer, initialized
    assert broker.count("init_transactions", TID) == 2
    published_once(broker, 2)


def test_fencing_an_id_closes_its_kept_producer(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """``fence_id`` (abort, recover) fences the id: the kept producer of it is closed, not
    used for a commit it would fail."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    fence_id(TID, config={}, sink_topic=OUT, transaction_timeout_ms=10_000, where="", clients=clients)
    assert kept(clients) == [] and broker.producers[0].closed
    commit(pipeline, ledger, clients, 2)
    published_once(broker, 2)


@pytest.mark.parametrize("keep", [0, 2])
def test_a_small_commit_makes_seven_ledger_calls(
    keep: int, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's commit of checkpoint 3 (one shard, a marker from checkpoint 2): read the
    checkpoint and the pipeline, the lease (before the shard's fence, so a live committer of
    another process is refused before it is fenced), its renewal with the PENDING row before
    begin (an abort that took it over meanwhile stops the shard), COMMITTED, mark_committed;
    with ``keep_committed_staging=2`` also checkpoint 1's staging location, removed."""
    import dataclasses

    pipeline = dataclasses.replace(pipeline, keep_committed_staging=keep)
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    commit(pipeline, ledger, clients, 2)
    cid = prepare(ledger, pipeline, 3)
    calls: list[str] = []
    for name in (
        "get",
        "get_pipeline",
        "pin_transactional_id_prefix",
        "freeze_commit_plan",
        "acquire_commit_lease",
        "record_shard",
        "mark_committed",
    ):
        real = getattr(ledger, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(_name if _name != "record_shard" else f"record_shard {kwargs['state']}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(ledger, name, counted)
    began: list[list[str]] = []
    broker.on_call["begin_transaction"] = lambda producer: began.append(list(calls))
    commit_checkpoint(pipeline, ledger, cid, clients=clients)
    assert calls == [
        "get",
        "get_pipeline",
        "acquire_commit_lease",  # before the first fence
        "acquire_commit_lease",  # renewed right before begin_transaction
        "record_shard PENDING",
        "record_shard COMMITTED",
        "mark_committed",
        *(["get"] if keep else []),  # checkpoint 1's staging location
    ]
    assert began == [calls[:5]]  # the lease and the PENDING row before begin_transaction
    published_once(broker, 3)
    left = sorted(p.name for p in (Path(pipeline.staging_dir) / pipeline.name).iterdir())
    assert left == ([f"cp-{n:010d}" for n in (2, 3)] if keep else [])  # the staging removed


def test_another_prefix_is_still_refused(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> None:
    """The pin is skipped only when the process's prefix is the pinned one."""
    import dataclasses

    from airflow_provider_eo.ledger.pipelines import TransactionalIdPrefixMismatch

    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    cid = prepare(ledger, pipeline, 2)
    other = dataclasses.replace(pipeline, transactional_id_prefix="elsewhere")
    with pytest.raises(TransactionalIdPrefixMismatch):
        commit_checkpoint(other, ledger, cid, clients=clients)
    assert broker.count("begin_transaction") == 1


def test_a_failed_marker_read_on_a_kept_producer_is_redone_after_init_transactions(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No init_transactions ran before a kept producer's marker read: another process's
    transaction left open on the id can hold that stable read until it times out. A failed
    read is redone in a round with a new producer (whose init aborts that transaction), not
    failed; a fresh producer's failed read fails as before."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    real = clients.committed_marks
    inits_at_failure: list[int] = []
    reads = {"n": 0}

    def committed_marks(group: str, partitions: list[tuple[str, int]], *, stable: bool = True) -> Any:
        reads["n"] += 1
        if reads["n"] == 2:  # the shard's own read (the first: the commit's check of every shard)
            inits_at_failure.append(broker.count("init_transactions", TID))
            raise KafkaAdminError("reading offsets of group 'g' failed: timed out")
        return real(group, partitions, stable=stable)

    monkeypatch.setattr(clients, "committed_marks", committed_marks)
    commit(pipeline, ledger, clients, 2)
    assert inits_at_failure == [1]  # the read failed on the kept producer's round
    assert broker.count("init_transactions", TID) == 2 and broker.count("new_producer", TID) == 2
    published_once(broker, 2)
    PRODUCERS.close()
    reads["n"] = 0
    cid = prepare(ledger, pipeline, 3)
    with pytest.raises(KafkaAdminError):
        commit_checkpoint(pipeline, ledger, cid, clients=clients)


@pytest.mark.parametrize("times", [1, 2])
def test_a_kept_producers_final_failure_is_redone_once_with_a_new_producer(
    times: int, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """An error that fails the shard for good (here an unclassified one) on a kept producer's
    round gets one round with a new producer and init_transactions, as every round began
    before; if that one fails too, the commit fails as before, with nothing published."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    unknown = kafka_error(KafkaError.UNKNOWN)
    broker.fail("flush", *[unknown] * times)
    cid = prepare(ledger, pipeline, 2)
    if times == 1:
        commit_checkpoint(pipeline, ledger, cid, clients=clients)
        published_once(broker, 2)
    else:
        with pytest.raises(CommitError, match="unclassified Kafka error"):
            commit_checkpoint(pipeline, ledger, cid, clients=clients)
        published_once(broker, 1)
    assert broker.count("init_transactions", TID) == 2  # one redo, not MAX_SHARD_ROUNDS


@pytest.mark.parametrize("fails", [False, True])
def test_the_stream_closes_the_kept_producers_when_it_ends(
    fails: bool, tmp_path: Path, make_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_stream closes the producers its committer kept, whether the stream ends or fails
    (not left to the interpreter's exit, when a test session's broker is gone)."""
    from eo_fake_kafka import fake_pipeline

    from airflow_provider_eo.core import stream

    pipeline = fake_pipeline(tmp_path, sink=OUT, shards=1)
    ledger = make_ledger()
    producer = FakeProducer(FakeBroker(), TID, None)

    def drive_stream(*args: Any, **kwargs: Any) -> stream.StreamResult:
        PRODUCERS.give("a kept producer", producer, publisher.DeliveryFailures())  # as a commit does
        if fails:
            raise RuntimeError("the commit failed")
        return stream.StreamResult(pipeline=pipeline.name, commit="inline", reason="checkpoints")

    class Stager:
        def start(self, pipeline: Pipeline) -> None:
            pass

    monkeypatch.setattr(stream, "drive_stream", drive_stream)
    if fails:
        with pytest.raises(RuntimeError):
            stream.run_stream(pipeline, ledger=ledger, stager=Stager(), max_checkpoints=1)  # type: ignore[arg-type]
    else:
        stream.run_stream(pipeline, ledger=ledger, stager=Stager(), max_checkpoints=1)  # type: ignore[arg-type]
    assert producer.closed and len(PRODUCERS) == 0


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_a_kept_producer_that_lost_its_connection_while_idle_is_not_reused(
    code: int, pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """A broker restart while the producer was kept: librdkafka's send_offsets_to_transaction
    on it can wait with no end for the coordinator it cached. Its error_cb saw the lost
    connection, so the next commit makes a fresh producer (and init_transactions)."""
    clients = FakeClients(broker)
    commit(pipeline, ledger, clients, 1)
    (entry,) = [e for key, e in PRODUCERS._idle.items() if key[0] is clients]
    entry.failures.connection_error(KafkaError(code))  # what the producer's error_cb gets
    commit(pipeline, ledger, clients, 2)
    assert broker.count("new_producer", TID) == 2 and broker.count("init_transactions", TID) == 2
    assert kept(clients) == [broker.producers[1]]
    commit(pipeline, ledger, clients, 3)  # a producer that saw no error is kept as before
    assert broker.count("new_producer", TID) == 2
    published_once(broker, 3)


def test_a_producers_error_callback_marks_only_lost_connections() -> None:
    failures = DeliveryFailures()
    failures.connection_error(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert not failures.disconnected and not failures  # no delivery failure either
    failures.connection_error(KafkaError(KafkaError._TRANSPORT))
    assert failures.disconnected and not failures
