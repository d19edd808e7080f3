"""Dead letters: source records the transform fails on, or whose output the sink refuses as
too large, go to the dead-letter topic in the same transaction as the checkpoint's output;
counted in the ledger and by the audit against the source."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from eo_harness import EO

from airflow_provider_eo import names
from airflow_provider_eo.errors import PrepareError, TransformError
from airflow_provider_eo.kafka.admin import admin_client
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

# (partition, index among that partition's records) -> value; everything else is "ok-<p>-<i>"
SPECIAL = {
    (0, 5): b"POISON-a",
    (0, 31): b"BIG-a",
    (1, 0): b"POISON-b",
    (1, 17): b"POISON-c",
    (1, 39): b"BIG-b",
}
PER_PARTITION = 40


def _feed(
    h: Any, special: dict[tuple[int, int], bytes] = SPECIAL, producer_config: dict[str, Any] | None = None
) -> dict[tuple[int, int], bytes]:
    """40 records into each of the source's 2 partitions (offsets 0..39), ``special`` included."""
    topic = h.pipeline.source_topics[0]
    producer = Producer({**h.config, **(producer_config or {})})
    sent = {}
    for p in (0, 1):
        for i in range(PER_PARTITION):
            value = special.get((p, i), f"ok-{p}-{i}".encode())
            producer.produce(
                topic, key=f"k{i}".encode(), value=value, partition=p, headers=[("h", b"%d" % i)]
            )
            sent[(p, i)] = value
    assert producer.flush(30) == 0
    return sent


def _dead_letter_harness(harness: Callable[..., Any], make_topic: Callable[..., str], budget: int) -> Any:
    return harness(
        source_partitions=2,
        sink_partitions=2,
        commit_shards=2,
        transform="eo_test_transforms:poison_or_big",
        sink_config={"max.message.bytes": "3000"},
        dead_letter_topic=make_topic("dlq", partitions=2),
        max_dead_letters_per_checkpoint=budget,
    )


def _headers(msg: Any) -> dict[str, bytes]:
    return dict(msg.headers() or [])


def test_dead_letters_go_out_with_the_checkpoint(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    h = _dead_letter_harness(harness, make_topic, budget=5)
    sent = _feed(h)
    topic = h.pipeline.source_topics[0]
    (result,) = h.drain()
    cp = h.ledger.get(h.pipeline.name, result.checkpoint.checkpoint_id)
    assert cp.state is CheckpointState.COMMITTED
    assert (cp.records_read, cp.dead_letters, cp.records) == (80, 5, 75)

    # The sink: every other source record, once (counted against what was produced).
    published = sorted(bytes(m.value()) for m in h.sink_records())
    expected = sorted(v for pos, v in sent.items() if pos not in SPECIAL)
    assert published == expected

    # The dead-letter topic: the 5 source records as they were, with the eo.* headers.
    dead = read_sink(h.config, h.pipeline.dead_letter_topic)
    assert len(dead) == 5
    by_position = {}
    for m in dead:
        hd = _headers(m)
        assert hd[names.HEADER_DLQ_TOPIC] == topic.encode()
        assert hd[names.HEADER_DLQ_PIPELINE] == h.pipeline.name.encode()
        assert hd[names.HEADER_DLQ_CHECKPOINT] == str(cp.checkpoint_id).encode()
        assert hd["h"] == hd[names.HEADER_DLQ_OFFSET]  # the source record's own header kept
        position = (int(hd[names.HEADER_DLQ_PARTITION]), int(hd[names.HEADER_DLQ_OFFSET]))
        by_position[position] = (bytes(m.value()), hd[names.HEADER_DLQ_ERROR].decode())
    assert set(by_position) == set(SPECIAL)
    for position, (value, error) in by_position.items():
        assert value == SPECIAL[position]
        if value.startswith(b"POISON"):
            assert f"cannot parse record: {value.decode()}" in error
        else:
            assert "exceeds the sink topic's max.message.bytes=3000" in error

    # The audit finds them on the dead-letter topic; nothing is missing against the source.
    report = h.assert_exactly_once(expected_records=75)
    assert (report.source_records, report.dead_letters, report.missing) == (80, 5, 0)

    # An audit that cannot find them there (another dead-letter topic) calls them missing:
    # it reads the topic, it does not trust the ledger's count.
    elsewhere = h.with_(dead_letter_topic=make_topic("dlq-empty"))
    assert elsewhere.audit().missing == 5

    # `eo checkpoints` shows the count.
    out = subprocess.run(
        [EO, "checkpoints", h.pipeline.name, "--ledger-url", h.pipeline.ledger_url],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    assert "dead letters" in out.stdout
    assert re.search(rf"│\s+{cp.checkpoint_id}\s+│\s+COMMITTED\s+│\s+1\s+│\s+75\s+│\s+5\s+│", out.stdout), (
        out.stdout
    )


def test_more_than_the_budget_fails_naming_the_record(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    h = _dead_letter_harness(harness, make_topic, budget=1)
    _feed(h, {(0, 5): b"POISON-a", (1, 17): b"POISON-c"})
    with pytest.raises(TransformError, match=r"more than max_dead_letters_per_checkpoint=1 .* offset \d+"):
        h.run_once()
    assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
    assert read_sink(h.config, h.pipeline.sink_topic) == []
    assert read_sink(h.config, h.pipeline.dead_letter_topic) == []
    assert list(Path(h.pipeline.staging_dir).rglob("*.parquet")) == []  # the attempt is gone


def test_killed_commit_never_sends_a_dead_letter_twice(
    harness: Callable[..., Any], make_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dead letters travel in the transaction of the shard that moves the group: a
    committer killed with that transaction open leaves nothing visible, the retry sends
    it once."""
    h = _dead_letter_harness(harness, make_topic, budget=5)
    _feed(h, {(1, 17): b"POISON-c"})  # one dead letter keeps the prepare short
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    monkeypatch.setenv("EO_FAULT_HIT", "2")  # killed in the second (last) shard's transaction
    killed = h.cli("commit", fault="commit.before_commit_txn")
    assert killed.returncode != 0
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED
    assert {s.shard: s.state.value for s in cp.shards}[0] == "COMMITTED"
    # What a read_committed consumer sees now (the killed shard's transaction stays open
    # until the retry's init_transactions aborts it: nothing to wait for).
    assert read_sink(h.config, h.pipeline.dead_letter_topic, settle_s=0) == []
    h.commit(planned.checkpoint_id)
    assert len(read_sink(h.config, h.pipeline.dead_letter_topic)) == 1
    h.assert_exactly_once(expected_records=79)


# A poison record larger than a small sink allows: its dead letter is the whole source record.
HUGE_POISON = b"POISON-huge-" + b"p" * 6000


def test_a_dead_letter_over_the_dead_letter_topics_limit_is_refused_at_prepare(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    h = harness(
        source_partitions=2,
        sink_partitions=2,
        transform="eo_test_transforms:poison_or_big",
        sink_config={"max.message.bytes": "3000"},
        dead_letter_topic=make_topic("dlq", partitions=2, **{"max.message.bytes": "4000"}),
        max_dead_letters_per_checkpoint=5,
    )
    _feed(h, {(0, 7): HUGE_POISON})
    topic = h.pipeline.source_topics[0]
    cp = h.plan()
    with pytest.raises(PrepareError) as refused:
        h.prepare(cp.checkpoint_id)
    message = str(refused.value)
    # The record's source position, its size, both limits and what to do.
    assert f"{topic}[0] offset 7" in message, message
    assert re.search(r"dead letter of \d{4,} bytes", message), message
    assert "max.message.bytes=4000" in message and "max.message.bytes=3000" in message, message
    assert f"Raise the max.message.bytes of {h.pipeline.dead_letter_topic!r}" in message, message
    # Nothing wedges at commit: the checkpoint never got there, nothing was published.
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED
    assert read_sink(h.config, h.pipeline.sink_topic) == []
    assert read_sink(h.config, h.pipeline.dead_letter_topic) == []
    assert list(Path(h.pipeline.staging_dir).rglob("*.parquet")) == []


def test_a_dead_letter_larger_than_the_sink_allows_goes_to_a_roomier_dead_letter_topic(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    # A poison record of 1.5 MB: over the sink's limit and over librdkafka's default
    # message.max.bytes (1,000,000), which the commit's producer kept unless the sink's
    # limit was larger; within the dead-letter topic's 4 MB.
    big = 4_000_000
    h = harness(
        source_partitions=2,
        sink_partitions=2,
        commit_shards=2,
        transform="eo_test_transforms:poison_or_big",
        sink_config={"max.message.bytes": "3000"},
        dead_letter_topic=make_topic("dlq", partitions=2, **{"max.message.bytes": str(big)}),
        max_dead_letters_per_checkpoint=5,
    )
    source = h.pipeline.source_topics[0]
    entry = ConfigEntry("max.message.bytes", str(big), incremental_operation=AlterConfigOpType.SET)
    for future in (
        admin_client(h.config)
        .incremental_alter_configs([ConfigResource(ResourceType.TOPIC, source, incremental_configs=[entry])])
        .values()
    ):
        future.result(timeout=30)
    huge = b"POISON-huge-" + b"p" * 1_500_000
    sent = _feed(h, {(0, 7): huge}, producer_config={"message.max.bytes": big + 10_000})
    (result,) = h.drain()
    cp = h.ledger.get(h.pipeline.name, result.checkpoint.checkpoint_id)
    assert cp.state is CheckpointState.COMMITTED
    assert (cp.records_read, cp.dead_letters, cp.records) == (80, 1, 79)
    # Counted against the source: every other record once in the sink, the poison one once
    # (whole) on the dead-letter topic.
    published = sorted(bytes(m.value()) for m in h.sink_records())
    assert published == sorted(v for pos, v in sent.items() if pos != (0, 7))
    dead = read_sink(h.config, h.pipeline.dead_letter_topic)
    assert [bytes(m.value()) for m in dead] == [huge]
    assert _headers(dead[0])[names.HEADER_DLQ_OFFSET] == b"7"
    h.assert_exactly_once(expected_records=79)


def test_a_dead_letter_sent_twice_fails_the_audit(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    """A dead letter is one of the ways a source record is accounted for: a second copy on
    the dead-letter topic (here copied there again, headers and all) is a duplicate, and
    `eo audit` says so and exits 2, naming the source record."""
    h = _dead_letter_harness(harness, make_topic, budget=5)
    _feed(h, {(0, 5): b"POISON-a", (1, 0): b"POISON-b", (1, 17): b"POISON-c"})
    h.drain()
    assert h.cli("audit").returncode == 0
    dead = read_sink(h.config, h.pipeline.dead_letter_topic)
    assert len(dead) == 3
    copied = next(m for m in dead if _headers(m)[names.HEADER_DLQ_OFFSET] == b"17")
    producer = Producer(h.config)
    producer.produce(
        h.pipeline.dead_letter_topic,
        key=copied.key(),
        value=copied.value(),
        partition=copied.partition(),
        headers=list(copied.headers() or []),
    )
    assert producer.flush(30) == 0

    report = h.audit()
    assert (report.duplicates, report.missing, report.dead_letters) == (1, 0, 3), report.as_dict()
    topic = h.pipeline.source_topics[0]
    assert report.duplicated_sources == [f"{topic}:1:17"], report.as_dict()
    cli = h.cli("audit")
    assert cli.returncode == 2, (cli.stdout, cli.stderr)
    assert '"duplicates": 1' in cli.stdout
