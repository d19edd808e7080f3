"""Dead letters in the protocol's pure parts: settings, the budget, the manifest, the prepare's
accounting and the shard transaction that publishes them (against a fake Kafka: counted on
what the fake broker's committed transactions hold)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eo_fake_kafka import FakeBroker, FakeClients, make_committable, write_staged

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.prepare import (
    RangeRead,
    StageRequest,
    StageResult,
    check_dead_letters_fit,
    check_staged_visible,
)
from airflow_provider_eo.core.shard import ShardCommittable, commit_shard
from airflow_provider_eo.errors import DeadLetterTooLarge, StagingError, TransformError
from airflow_provider_eo.kafka.publisher import dead_letter_headers, record_batch_size
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError
from airflow_provider_eo.spark.dead_letters import admit

SINK, DLQ, GROUP = "sink", "dlq", "eo-markers"
KAFKA = {"bootstrap.servers": "fake:9092"}


def _pipeline(**kw: object) -> Pipeline:
    return Pipeline(name="orders", kafka=KAFKA, source_topics=["src"], sink_topic=SINK, **kw)  # type: ignore[arg-type]


def test_settings_are_checked() -> None:
    assert not _pipeline().dead_letters_enabled
    assert not _pipeline(dead_letter_topic=DLQ).dead_letters_enabled  # budget 0: off
    assert _pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=3).dead_letters_enabled
    with pytest.raises(
        PipelineConfigError, match="max_dead_letters_per_checkpoint=3 needs dead_letter_topic"
    ):
        _pipeline(max_dead_letters_per_checkpoint=3)
    with pytest.raises(PipelineConfigError, match="must be a topic of its own"):
        _pipeline(dead_letter_topic=SINK, max_dead_letters_per_checkpoint=1)
    with pytest.raises(PipelineConfigError, match="must be a topic of its own"):
        _pipeline(dead_letter_topic="src", max_dead_letters_per_checkpoint=1)
    with pytest.raises(PipelineConfigError, match=">= 0"):
        _pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=-1)
    p = _pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=3)
    assert Pipeline.from_json(p.to_json()) == p


def test_the_budget_names_the_record_past_it() -> None:
    p = _pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=2)
    exclude: dict[tuple[str, int, int], str] = {}
    admit(exclude, {("src", 0, 5): "bad"}, p, "pipeline 'orders', checkpoint 4")
    admit(exclude, {("src", 0, 5): "bad", ("src", 1, 2): "worse"}, p, "w")  # a known one is free
    assert set(exclude) == {("src", 0, 5), ("src", 1, 2)}
    with pytest.raises(
        TransformError,
        match=r"checkpoint 4: more than max_dead_letters_per_checkpoint=2 .*src\[0\] offset 9: oops",
    ):
        admit(exclude, {("src", 0, 9): "oops"}, p, "pipeline 'orders', checkpoint 4")
    assert len(exclude) == 2


def _dead_file(root: Path, rows: list[tuple[int, int, bytes, str]]) -> list[staging.StagedFile]:
    """A dead-letter Parquet file as the prepare writes it: (partition, offset, value, error)."""
    path = root / names.DEAD_LETTERS_DIR / "part-0.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table(
        {
            "key": pa.array([b"k"] * len(rows), pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "headers": pa.array([[{"key": "h", "value": b"1"}]] * len(rows), header),
            "src_topic": pa.array(["src"] * len(rows), pa.string()),
            "src_partition": pa.array([r[0] for r in rows], pa.int32()),
            "src_offset": pa.array([r[1] for r in rows], pa.int64()),
            "src_timestamp": pa.array([0] * len(rows), pa.int64()),
            "error": pa.array([r[3] for r in rows], pa.string()),
        }
    )
    pq.write_table(table, path)
    return staging.describe_dead_letters(str(root))


def test_manifest_keeps_the_dead_letters_and_verify_checks_them(tmp_path: Path) -> None:
    root = tmp_path / "attempt"
    files = {0: [write_staged(root, 0, [b"a", b"b"])]}
    dead = _dead_file(root, [(0, 7, b"POISON", "ValueError: no")])
    m = staging.Manifest("orders", 4, "a1", SINK, 1, files, 3, [], dead_letters=dead, dead_letter_topic=DLQ)
    back = staging.Manifest.from_json(m.to_json())
    assert back == m and back.dead_letter_count == 1 and back.records == 2
    staging.verify(str(root), m)
    (root / dead[0].path).write_bytes(b"changed")
    with pytest.raises(StagingError, match="dead letters"):
        staging.verify(str(root), m)


def test_dead_letters_are_not_dropped_records_and_must_be_visible(tmp_path: Path) -> None:
    root = tmp_path / "attempt"
    dead = tuple(_dead_file(root, [(0, 1, b"x", "e"), (0, 2, b"y", "e")]))
    reads = (RangeRead(RangeSpec("src", 0, 0, 10), 10, None, None),)
    result = StageResult(
        files={}, reads=reads, app_id=None, sources_kept=7, dead_letters=dead, dead_letters_written=2
    )
    assert (result.records_read, result.dead_letter_count, result.dropped) == (10, 2, 1)
    request = StageRequest(
        pipeline=_pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=5),
        checkpoint_id=4,
        attempt="a1",
        ranges=(RangeSpec("src", 0, 0, 10),),
        time_filter=None,
        sink_partitions=1,
        max_message_bytes=1000,
        path=str(root),
        where="pipeline 'orders', checkpoint 4",
    )
    check_staged_visible(request, result)
    unseen = dataclasses.replace(result, dead_letters=(), dead_letters_written=2)
    with pytest.raises(StagingError, match="wrote 2 dead letters but this process sees 0"):
        check_staged_visible(request, unseen)


def test_a_dead_letter_over_the_dead_letter_topics_limit_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "attempt"
    dead = tuple(_dead_file(root, [(0, 1, b"small", "e"), (1, 7, b"P" * 5000, "ValueError: bad")]))
    staged = StageResult(files={}, reads=(), app_id=None, dead_letters=dead, dead_letters_written=2)
    request = StageRequest(
        pipeline=_pipeline(dead_letter_topic=DLQ, max_dead_letters_per_checkpoint=5),
        checkpoint_id=4,
        attempt="a1",
        ranges=(),
        time_filter=None,
        sink_partitions=1,
        max_message_bytes=3000,
        path=str(root),
        where="pipeline 'orders', checkpoint 4",
    )
    (row,) = [r for r in pq.read_table(root / dead[0].path).to_pylist() if r["src_offset"] == 7]
    size = record_batch_size(
        row["key"],
        row["value"],
        dead_letter_headers(row, pipeline="orders", checkpoint_id=4, identity="id-1"),
    )
    assert 5000 < size < 5000 + 400  # the record, its headers and the framing, nothing more
    check_dead_letters_fit(request, staged, identity="id-1", limit=size)  # exactly the limit: sent
    with pytest.raises(DeadLetterTooLarge) as refused:
        check_dead_letters_fit(request, staged, identity="id-1", limit=size - 1)
    message = str(refused.value)
    for part in (
        "pipeline 'orders', checkpoint 4",
        "src[1] offset 7",
        f"dead letter of {size} bytes",
        f"dead-letter topic '{DLQ}' takes at most max.message.bytes={size - 1}",
        "sink topic 'sink': max.message.bytes=3000",
        "ValueError: bad",
        "stays PLANNED",
        f"at least {size}",
    ):
        assert part in message, message
    check_dead_letters_fit(request, dataclasses.replace(staged, dead_letters=()), identity="i", limit=1)


def _committable(tmp_path: Path, *, last: bool) -> ShardCommittable:
    root = tmp_path / "attempt"
    dead = _dead_file(root, [(0, 3, b"POISON-a", "ValueError: a"), (1, 9, b"POISON-b", "ValueError: b")])
    return make_committable(
        root,
        [b"v0", b"v1", b"v2"],
        checkpoint=4,
        last=last,
        dead_letter_topic=DLQ if last else None,
        dead_letters=tuple(dead) if last else (),
    )


class _Hooks:
    def may_have_published(self) -> bool:
        return False

    def before_begin(self) -> None:
        pass

    def committed(self, records: int) -> None:
        self.records = records


def test_the_shard_sends_dead_letters_in_its_transaction_with_their_headers(tmp_path: Path) -> None:
    broker = FakeBroker(partitions={SINK: 1, DLQ: 1})
    broker.fail("commit_transaction", RuntimeError("killed before the commit"))
    c = _committable(tmp_path, last=True)
    with pytest.raises(RuntimeError):
        commit_shard(c, _Hooks(), FakeClients(broker))
    assert broker.committed == []  # nothing of the transaction, dead letters included

    hooks = _Hooks()
    result = commit_shard(c, hooks, FakeClients(broker))
    assert result.records == hooks.records == 3  # output records; dead letters are not output
    dead = [r for r in broker.committed if r.topic == DLQ]
    assert [r.value for r in dead] == [b"POISON-a", b"POISON-b"]
    assert len([r for r in broker.committed if r.topic == SINK]) == 3
    h = dict(dead[1].headers)
    assert h["h"] == b"1"  # the source record's own header
    assert (h[names.HEADER_DLQ_ERROR], h[names.HEADER_DLQ_TOPIC]) == (b"ValueError: b", b"src")
    assert (h[names.HEADER_DLQ_PARTITION], h[names.HEADER_DLQ_OFFSET]) == (b"1", b"9")
    assert (h[names.HEADER_DLQ_PIPELINE], h[names.HEADER_DLQ_CHECKPOINT]) == (b"orders", b"4")
    assert h[names.HEADER_DLQ_IDENTITY] == b"01234567"

    again = commit_shard(c, _Hooks(), FakeClients(broker))  # a retry: the marker skips it all
    assert again.skipped and len([r for r in broker.committed if r.topic == DLQ]) == 2


def test_a_shard_that_does_not_move_the_group_sends_none(tmp_path: Path) -> None:
    broker = FakeBroker(partitions={SINK: 1, DLQ: 1})
    commit_shard(_committable(tmp_path, last=False), _Hooks(), FakeClients(broker))
    assert [r.topic for r in broker.committed] == [SINK] * 3
