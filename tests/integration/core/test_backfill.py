"""Backfill from stored offsets on a real broker and Spark.

Source records carry explicit Kafka timestamps over three days; the live pipeline commits
them; backfills of daily intervals go to a separate sink, read back with read_committed.
"""

from __future__ import annotations

import datetime as dt
import signal
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from eo_harness import Harness, parse_json_line
from sqlalchemy import MetaData, select

from airflow_provider_eo.core.backfill import BackfillRequest, backfill_pipeline, iso_ms, run_backfill
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

DAY = 86_400_000
# Three whole UTC days ending at today's midnight: recent enough for the broker's retention.
_MIDNIGHT = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
D0 = int(_MIDNIGHT.timestamp() * 1000) - 3 * DAY


def produce_days(h: Harness, n: int, *, first: int = 0, day: int | None = None) -> dict[str, int]:
    """``n`` records ``r<i>`` whose timestamps cycle through days 0, 1, 2 (or all ``day``),
    spread over the source partitions; returns {key: day}."""
    producer = Producer({**h.config, "linger.ms": 5})
    out: dict[str, int] = {}
    for i in range(first, first + n):
        d = i % 3 if day is None else day
        key = f"r{i}"
        ts = D0 + d * DAY + (i * 7919) % DAY  # anywhere in the day, not in offset order
        producer.produce(h.pipeline.source_topics[0], key=key, value=f"{key}@{d}".encode(), timestamp=ts)
        out[key] = d
    producer.flush(30)
    return out


def sink_keys(h: Harness, topic: str) -> Counter[str]:
    return Counter(m.key().decode() for m in read_sink(h.config, topic))


def backfill(h: Harness, sink: str, start_day: int, end_day: int, **kw: Any) -> Any:
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.spark.stager import SparkStager

    def prepare(pipeline: Any, ledger: Ledger, cid: int) -> None:
        prepare_checkpoint(pipeline, ledger, cid, stager=SparkStager(h.spark))

    request = BackfillRequest(
        h.pipeline,
        D0 + start_day * DAY,
        D0 + end_day * DAY,
        sink,
        transform=kw.pop("transform", None),
        allow_live_sink=kw.pop("allow_live_sink", False),
    )
    return run_backfill(request, h.ledger, prepare=prepare, **kw)


def expected(days: dict[str, int], *wanted: int) -> Counter[str]:
    return Counter(k for k, d in days.items() if d in wanted)


def snapshot(ledger: Ledger) -> dict[str, list[Any]]:
    """Every row of every ledger table (to prove a refused request changed nothing)."""
    meta = MetaData()
    meta.reflect(ledger.engine)
    with ledger.engine.connect() as conn:
        return {
            name: sorted(map(repr, conn.execute(select(table)).all()))
            for name, table in meta.tables.items()
            if name.startswith("eo_")
        }


def test_two_adjacent_days_exactly_once_and_reruns(
    harness: Callable[..., Harness], make_topic: Callable[..., str]
) -> None:
    h = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=40)
    days = produce_days(h, 90)
    h.drain()
    bf_sink = make_topic("bf", partitions=3)
    # Records the live pipeline has not committed yet are in no backfill.
    late = produce_days(h, 12, first=1000, day=1)

    seen: list[int] = []
    first = backfill(h, bf_sink, 0, 1, progress=lambda cp: seen.append(cp.checkpoint_id))
    second = backfill(h, bf_sink, 1, 2)
    assert first.records == 30 and second.records == 30
    assert len(first.checkpoints) >= 2  # 90 offsets with max_records_per_checkpoint=40
    assert seen == [cp.checkpoint_id for cp in first.checkpoints]
    assert sink_keys(h, bf_sink) == expected(days, 0, 1)  # each of the two days' records once

    # The same interval, and both together: nothing planned, nothing published.
    derived = backfill_pipeline(h.pipeline, bf_sink)
    before = h.ledger.get_pipeline(derived.name).last_checkpoint_id
    assert backfill(h, bf_sink, 0, 1).checkpoints == ()
    assert backfill(h, bf_sink, 0, 2).checkpoints == ()
    assert h.ledger.get_pipeline(derived.name).last_checkpoint_id == before
    assert sink_keys(h, bf_sink) == expected(days, 0, 1)
    # The live pipeline's own group and sink were never touched by the backfill.
    assert sum(1 for _ in read_sink(h.config, h.pipeline.sink_topic)) == 90

    # Records committed by the live pipeline after the backfill are added by a rerun, once.
    h.drain()
    third = backfill(h, bf_sink, 0, 2)
    assert third.records == 12
    assert sink_keys(h, bf_sink) == expected({**days, **late}, 0, 1)
    assert backfill(h, bf_sink, 0, 2).checkpoints == ()
    for cp in h.ledger.list_checkpoints(derived.name):
        assert cp.state is CheckpointState.COMMITTED and cp.time_filter is not None


@pytest.mark.parametrize(
    "step", ["prepare.after_write", "commit.before_commit_txn", "commit.after_commit_txn"]
)
def test_killed_backfill_completed_by_a_rerun_once(
    harness: Callable[..., Harness], make_topic: Callable[..., str], step: str
) -> None:
    h = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=50)
    days = produce_days(h, 60)
    h.drain()
    bf_sink = make_topic("bf", partitions=2)
    args = ("backfill", "--start", iso_ms(D0), "--end", iso_ms(D0 + 2 * DAY), "--sink-topic", bf_sink)
    proc = h.cli(*args, fault=step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    derived = backfill_pipeline(h.pipeline, bf_sink)
    unfinished = h.ledger.unfinished(derived.name)
    assert unfinished is not None
    want = CheckpointState.PLANNED if step.startswith("prepare") else CheckpointState.PREPARED
    assert unfinished.state is want
    # the rerun (the CLI, as a user would) finishes the interval exactly once
    proc = h.cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = parse_json_line(proc.stdout)
    assert unfinished.checkpoint_id in out["checkpoints"]
    assert sink_keys(h, bf_sink) == expected(days, 0, 1)
    assert h.ledger.unfinished(derived.name) is None


def test_errors_exit_nonzero_and_change_nothing(
    harness: Callable[..., Harness], make_topic: Callable[..., str]
) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    bf_sink = make_topic("bf", partitions=1)
    window = ("--start", iso_ms(D0), "--end", iso_ms(D0 + DAY))

    def refused(*args: str, match: str) -> None:
        before = snapshot(h.ledger)
        proc = h.cli("backfill", *args)
        assert proc.returncode != 0, proc.stdout
        assert match in proc.stderr, proc.stderr[-3000:]
        assert snapshot(h.ledger) == before

    # unknown pipeline (never run)
    refused(*window, "--sink-topic", bf_sink, match="is not in the ledger")
    days = produce_days(h, 30)
    h.plan()  # known, but nothing committed yet
    refused(*window, "--sink-topic", bf_sink, match="no COMMITTED checkpoint")
    h.drain()
    backwards = ("--start", iso_ms(D0 + DAY), "--end", iso_ms(D0))
    refused(*backwards, "--sink-topic", bf_sink, match="--end after --start")
    refused(*window, "--sink-topic", h.pipeline.sink_topic, match="--allow-live-sink")
    refused(*window, "--sink-topic", "no-such-topic-bf", match="does not exist")
    refused(*window, match="--sink-topic")  # the option is required
    refused("--start", "yesterday", "--end", iso_ms(D0), "--sink-topic", bf_sink, match="ISO-8601")
    # Kafka deleted the interval's records: the lost ranges are named
    client = AdminClient(h.config)
    futures = client.delete_records([KafkaTP(h.pipeline.source_topics[0], 0, 5)], request_timeout=30)
    for fut in futures.values():
        fut.result(timeout=60)
    refused(*window, "--sink-topic", bf_sink, match="[0, 5)")
    # a later interval whose offsets are all still there works
    assert len(days) == 30


def test_another_transform_for_the_same_target_is_refused(
    harness: Callable[..., Harness], make_topic: Callable[..., str]
) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    produce_days(h, 9)
    h.drain()
    bf_sink = make_topic("bf", partitions=1)
    assert backfill(h, bf_sink, 0, 1).records == 3
    before = snapshot(h.ledger)
    from airflow_provider_eo.errors import BackfillRefused

    with pytest.raises(BackfillRefused, match="one backfill target keeps one transform"):
        backfill(h, bf_sink, 1, 2, transform="eo_test_transforms:reshuffled")
    assert snapshot(h.ledger) == before
