"""commit_checkpoint, abort_checkpoint and recover_pipeline against a fake Kafka and a real
SQLite ledger: every branch of the protocol around the shard transactions.

Exactly-once is counted on the fake broker's committed transactions (what a
``read_committed`` consumer would see).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, kafka_error, write_staged

from airflow_provider_eo import names, staging
from airflow_provider_eo.core import plan as core_plan
from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.recover import recover_pipeline
from airflow_provider_eo.errors import AbortRefused, CommitFenced, NotPrepared
from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec, ShardState
from airflow_provider_eo.pipeline import Pipeline

SINK = "sink"
SRC = "src"


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker(partitions={SINK: 2, SRC: 1})
    # The frozen plan's check asks Kafka for the sink's partition count.
    monkeypatch.setattr(core_plan.admin, "partition_count", lambda _config, topic: fake.partitions[topic])
    return fake


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "fake:9092"},
        source_topics=[SRC],
        sink_topic=SINK,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        commit_shards=2,
    )


@pytest.fixture
def ledger(pipeline: Pipeline) -> Iterator[Ledger]:
    led = Ledger(pipeline.ledger_url)
    led.ensure_pipeline(pipeline.name, "fp-1")
    yield led
    led.close()


def prepared(pipeline: Pipeline, ledger: Ledger, *, start: int = 0, end: int = 6) -> int:
    """Plan one checkpoint of [start, end) and stage its output (3 records per sink
    partition), PREPARED; its id."""
    plan = names.commit_plan(pipeline, 2)
    cp = ledger.plan(pipeline.name, [RangeSpec(SRC, 0, start, end)], commit_plan=plan).checkpoint_id
    attempt = f"a{cp}"
    root = Path(names.attempt_dir(pipeline, cp, attempt))
    files = {p: [write_staged(root, p, [f"c{cp}-p{p}-{i}".encode() for i in range(3)])] for p in (0, 1)}
    manifest = staging.Manifest(
        pipeline=pipeline.name,
        checkpoint_id=cp,
        attempt=attempt,
        sink_topic=SINK,
        sink_partitions=2,
        files=files,
        records_read=end - start,
        ranges=[],
    )
    staging.write_manifest(str(root), manifest)
    ledger.mark_prepared(
        pipeline.name,
        cp,
        attempt=attempt,
        staging_location=str(root),
        records=6,
        bytes_=manifest.bytes,
        shard_counts={0: 3, 1: 3},
    )
    return cp


def sink_values(broker: FakeBroker) -> list[bytes | None]:
    return sorted(r.value for r in broker.committed if r.topic == SINK)  # type: ignore[type-var]


def test_commit_publishes_every_shard_once_and_moves_the_group_with_the_last(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    result = commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    assert result.published == 6 and result.shards_skipped == 0
    assert len(sink_values(broker)) == 6 and len(set(sink_values(broker))) == 6
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert {s.shard: s.state for s in result.checkpoint.shards} == {
        0: ShardState.COMMITTED,
        1: ShardState.COMMITTED,
    }
    group = names.marker_group(pipeline)
    assert broker.mark(group, SINK, 0) == cp and broker.mark(group, SINK, 1) == cp
    assert broker.mark(pipeline.group_id, SRC, 0) == 6
    # only the plan's last shard carried the group's offsets
    by_id = {p.transactional_id for p in broker.producers}
    assert by_id == {"eo.orders.0", "eo.orders.1"}


def test_commit_of_a_committed_checkpoint_does_nothing(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    calls = len(broker.calls)
    again = commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    assert again.note == "already COMMITTED" and len(broker.calls) == calls


def test_commit_of_a_planned_checkpoint_is_refused(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = ledger.plan(pipeline.name, [RangeSpec(SRC, 0, 0, 6)], commit_plan=names.commit_plan(pipeline, 2))
    with pytest.raises(NotPrepared, match="run \\(or retry\\) its prepare step first"):
        commit_checkpoint(pipeline, ledger, cp.checkpoint_id, clients=FakeClients(broker))


def test_retry_after_a_partial_commit_publishes_only_the_missing_shard(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    """Shard 0 committed, then the committer was fenced on shard 1 (a crash between
    shards): the retry skips shard 0 by its marker and publishes shard 1, nothing twice."""
    cp = prepared(pipeline, ledger)
    broker.fail("commit_transaction", None, kafka_error(-144, fatal=True))  # _FENCED on shard 1
    with pytest.raises(CommitFenced):
        commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    assert ledger.get(pipeline.name, cp).state is CheckpointState.PREPARED
    assert len(sink_values(broker)) == 3
    assert broker.mark(pipeline.group_id, SRC, 0) == -1  # the group never passes unpublished output
    retry = commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    assert (retry.published, retry.shards_skipped) == (3, 1)
    values = sink_values(broker)
    assert len(values) == 6 and len(set(values)) == 6
    assert retry.checkpoint.state is CheckpointState.COMMITTED


def test_a_staging_mismatch_aborts_instead_of_publishing(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    record = ledger.get(pipeline.name, cp)
    data = next(Path(record.staging_location or "").rglob("*.parquet"))
    data.write_bytes(data.read_bytes()[:-10])  # truncated staged file
    with pytest.raises(Exception, match="ABORTED"):
        commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    assert ledger.get(pipeline.name, cp).state is CheckpointState.ABORTED
    assert sink_values(broker) == []


def test_abort_fences_every_shard_before_reading_markers(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    reads: list[int] = []
    clients = FakeClients(broker)
    original = clients.committed_marks

    def counting(config, group, partitions):  # type: ignore[no-untyped-def]
        reads.append(broker.count("init_transactions"))
        return original(config, group, partitions)

    clients.committed_marks = counting  # type: ignore[method-assign]
    aborted = abort_checkpoint(pipeline, ledger, cp, reason="test", clients=clients)
    assert aborted.state is CheckpointState.ABORTED
    assert reads and min(reads) == 2  # both ids fenced before the first marker read
    assert broker.epochs == {"eo.orders.0": 1, "eo.orders.1": 1}
    # idempotent
    assert (
        abort_checkpoint(pipeline, ledger, cp, reason="again", clients=clients).state
        is CheckpointState.ABORTED
    )


def test_abort_is_refused_while_a_live_committer_holds_the_lease(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    ledger.acquire_commit_lease(pipeline.name, cp, owner="committer-on-host-a", ttl_s=300)
    with pytest.raises(AbortRefused, match="live committer"):
        abort_checkpoint(pipeline, ledger, cp, reason="test", clients=FakeClients(broker))
    assert ledger.get(pipeline.name, cp).state is CheckpointState.PREPARED
    assert broker.count("init_transactions") == 0  # refused before fencing anyone


def test_abort_is_refused_when_a_shard_published(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    ident = ledger.get_pipeline(pipeline.name).identity
    broker.marks[(names.marker_group(pipeline), SINK, 1)] = (cp, names.marker_metadata(ident))
    with pytest.raises(AbortRefused, match=r"shards \[1\] were already published"):
        abort_checkpoint(pipeline, ledger, cp, reason="test", clients=FakeClients(broker))
    assert ledger.get(pipeline.name, cp).state is CheckpointState.PREPARED


def test_abort_of_a_committed_checkpoint_is_refused(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    with pytest.raises(AbortRefused, match="is COMMITTED"):
        abort_checkpoint(pipeline, ledger, cp, reason="test", clients=FakeClients(broker))


def test_recover_commits_the_prepared_checkpoint_and_fences_the_other_ids(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    first = prepared(pipeline, ledger)
    commit_checkpoint(pipeline, ledger, first, clients=FakeClients(broker))
    cp = prepared(pipeline, ledger, start=6, end=12)
    clients = FakeClients(broker)
    clients.open = {SINK: {0: (3, 5)}}
    result = recover_pipeline(pipeline, ledger, clients=clients, wait_s=0)
    assert result.committed == cp and result.published == 6
    assert result.open_before == {0: (3, 5)}
    assert ledger.get(pipeline.name, cp).state is CheckpointState.COMMITTED
    values = sink_values(broker)
    assert len(values) == 12 and len(set(values)) == 12
    # the committed checkpoint's ids were fenced by its commit; none is fenced twice
    assert result.fenced == []
    assert not result.clean  # the fake's open transaction is someone else's


def test_recover_fences_ids_of_finished_checkpoints(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared(pipeline, ledger)
    commit_checkpoint(pipeline, ledger, cp, clients=FakeClients(broker))
    before = dict(broker.epochs)
    result = recover_pipeline(pipeline, ledger, clients=FakeClients(broker), wait_s=0)
    assert result.committed is None and result.clean
    assert result.fenced == ["eo.orders.0", "eo.orders.1"]
    assert all(broker.epochs[i] == before[i] + 1 for i in result.fenced)
