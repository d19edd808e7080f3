"""A shard's producer kept between clean local commits (core/shard.py, kafka/publisher.py's
ProducerPool) on the real broker: another process that inits the same transactional id
between two of our commits (an ``eo commit`` elsewhere, a restarted stream) fences the kept
producer; the commit must then do what a fresh producer did before, and nothing is
published twice (counted with a read_committed consumer).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from eo_fake_kafka import prepared_checkpoint

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.commit import commit_checkpoint, shard_committable
from airflow_provider_eo.core.shard import RealKafka, commit_shard
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.kafka.publisher import PRODUCERS
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka]


class Counting(RealKafka):
    """The real clients, counting the producers they create."""

    def __init__(self, kafka: dict[str, Any]) -> None:
        super().__init__(RealKafka.of(kafka).config)
        self.created = 0

    def producer(self, *args: Any, **kwargs: Any) -> Any:
        self.created += 1
        return super().producer(*args, **kwargs)


class NoLedger:
    """Hooks of a committer that records nothing (another process's commit task)."""

    def may_have_published(self) -> bool:
        return True

    def before_begin(self) -> None:
        pass

    def committed(self, records: int) -> None:
        pass


def output(n: int) -> dict[int, list[bytes]]:
    return {0: [f"c{n}-{i}".encode() for i in range(5)]}


@pytest.fixture()
def setup(kafka_config: dict[str, Any], make_topic: Any, tmp_path: Path) -> Iterator[tuple[Pipeline, Ledger]]:
    admin.ensure_topic(kafka_config, "in", partitions=1)  # the checkpoints' source (eo_fake_kafka)
    sink = make_topic("sink", partitions=1)
    pipeline = Pipeline(
        name=f"reuse-{uuid.uuid4().hex[:8]}",
        kafka=dict(kafka_config),
        source_topics=["in"],
        sink_topic=sink,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        transaction_timeout_ms=30_000,
    )
    ledger = Ledger(pipeline.ledger_url)
    ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    PRODUCERS.close()
    try:
        yield pipeline, ledger
    finally:
        PRODUCERS.close()
        ledger.close()


def prepare(ledger: Ledger, pipeline: Pipeline, n: int) -> int:
    cp = prepared_checkpoint(ledger, pipeline, output(n), sink_partitions=1, start=10 * (n - 1))
    return cp.checkpoint_id


def kept(clients: Any) -> list[Any]:
    return [entry.producer for key, entry in PRODUCERS._idle.items() if key[0] is clients]


def sink_values(config: dict[str, Any], pipeline: Pipeline) -> list[bytes]:
    return [m.value() for m in read_sink(dict(config), pipeline.sink_topic)]


def test_a_kept_producer_is_used_for_the_next_checkpoints(
    setup: tuple[Pipeline, Ledger], kafka_config: dict[str, Any]
) -> None:
    pipeline, ledger = setup
    ours = Counting(pipeline.kafka)
    for n in (1, 2, 3):
        commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, n), clients=ours)
    assert ours.created == 1 and len(kept(ours)) == 1
    assert sink_values(kafka_config, pipeline) == [v for n in (1, 2, 3) for v in output(n)[0]]


def test_another_process_fences_the_kept_producer_between_two_commits(
    setup: tuple[Pipeline, Ledger], kafka_config: dict[str, Any]
) -> None:
    """The other process inits the id and leaves a transaction open: our kept producer is
    fenced at its first request; the round is redone with a new producer whose
    init_transactions aborts the other's transaction. Each record once, nothing of the
    other's visible, the other one fenced."""
    pipeline, ledger = setup
    ours = Counting(pipeline.kafka)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 1), clients=ours)
    (first,) = kept(ours)
    other = Producer(
        {**kafka_config, "transactional.id": f"eo.{pipeline.name}.0", "transaction.timeout.ms": 60_000}
    )
    try:
        other.init_transactions(30)
        other.begin_transaction()
        other.produce(pipeline.sink_topic, value=b"zombie", partition=0)
        other.flush(30)
        result = commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 2), clients=ours)
        assert result.checkpoint.state is CheckpointState.COMMITTED and result.published == 5
        assert ours.created == 2  # the kept one (fenced), then a new one
        assert kept(ours) != [first] and len(kept(ours)) == 1
        with pytest.raises(KafkaException):
            other.commit_transaction(30)  # fenced by our new producer's init_transactions
    finally:
        with contextlib.suppress(KafkaException):  # fenced: its close fails, and destroys it
            other.close()  # not left to the session's end (its broker is gone by then)
    assert sink_values(kafka_config, pipeline) == [v for n in (1, 2) for v in output(n)[0]]


def test_another_process_that_published_the_checkpoint_meanwhile_is_not_published_again(
    setup: tuple[Pipeline, Ledger], kafka_config: dict[str, Any]
) -> None:
    """Another committer (its own producer, so it fenced ours) publishes checkpoint 2 and
    dies before its ledger write; our commit of it finds the marker and sends nothing."""
    pipeline, ledger = setup
    ours = Counting(pipeline.kafka)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 1), clients=ours)
    cid = prepare(ledger, pipeline, 2)
    cp = ledger.get(pipeline.name, cid)
    assert cp.commit_plan is not None
    manifest = staging.read_manifest(cp.staging_location or "")
    identity = ledger.get_pipeline(pipeline.name).identity
    theirs = shard_committable(pipeline, identity, cp, manifest, cp.commit_plan, 0, topic_max_bytes=None)
    assert theirs.transactional_id == names.plan_transactional_id(cp.commit_plan, pipeline.name, 0)
    assert commit_shard(theirs, NoLedger()).records == 5
    result = commit_checkpoint(pipeline, ledger, cid, clients=ours)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert (result.published, result.shards_skipped) == (0, 1)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 3), clients=ours)
    assert sink_values(kafka_config, pipeline) == [v for n in (1, 2, 3) for v in output(n)[0]]


def test_a_commit_after_an_abortable_failure_uses_a_new_producer(
    setup: tuple[Pipeline, Ledger], kafka_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that aborted (here: the commit of a kept producer's transaction is refused as
    abortable) drops the producer: the redo and the next checkpoint never see it again."""
    from confluent_kafka import KafkaError

    from airflow_provider_eo.core import shard as shard_module

    pipeline, ledger = setup
    ours = Counting(pipeline.kafka)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 1), clients=ours)
    (first,) = kept(ours)
    real_commit = shard_module.ShardTransaction.commit
    refused: list[Any] = []

    def commit(self: Any) -> None:
        if self.producer is first and not refused:
            refused.append(self.producer)
            err = KafkaError(KafkaError._STATE, "injected", txn_requires_abort=True)
            raise shard_module.Abortable("commit_transaction: injected") from KafkaException(err)
        real_commit(self)

    monkeypatch.setattr(shard_module.ShardTransaction, "commit", commit)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 2), clients=ours)
    assert refused == [first] and ours.created == 2 and first not in kept(ours)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 3), clients=ours)
    assert ours.created == 2
    assert sink_values(kafka_config, pipeline) == [v for n in (1, 2, 3) for v in output(n)[0]]


def test_close_producers_leaves_no_idle_producer(setup: tuple[Pipeline, Ledger]) -> None:
    pipeline, ledger = setup
    ours = Counting(pipeline.kafka)
    commit_checkpoint(pipeline, ledger, prepare(ledger, pipeline, 1), clients=ours)
    assert len(kept(ours)) == 1
    assert PRODUCERS.close() == 1 and kept(ours) == []
