"""The commit's read-back (a shard's marker is missing) under a foreign open transaction.

A read_committed reader sees a partition only up to its last stable offset: the start of
the oldest open transaction. A shard whose records were committed after a foreign producer
opened a transaction on its sink partition has them beyond that offset, so a read bounded by
it says "not published" and the commit would publish them again. The read-back must wait
for those records to be decided, or refuse naming the partition; a foreign transaction that
opened after the shard's records must not hold it up at all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_fake_kafka import write_staged

from airflow_provider_eo.core.shard import ShardCommittable, commit_shard
from airflow_provider_eo.errors import ReadBackBlocked
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink

pytestmark = [pytest.mark.kafka]

RECORDS = 20


class Hooks:
    """The ledger's answers: ``row`` says whether a try may have begun a transaction."""

    def __init__(self, *, row: bool) -> None:
        self.row = row

    def may_have_published(self) -> bool:
        return self.row

    def before_begin(self) -> None:
        self.row = True

    def committed(self, records: int) -> None:
        pass


def committable(config: Mapping[str, Any], sink: str, staged: Path) -> ShardCommittable:
    files = (write_staged(staged, 0, [f"v{i}".encode() for i in range(RECORDS)]),)
    name = f"rb-{uuid.uuid4().hex[:8]}"
    return ShardCommittable(
        pipeline=name,
        identity="0123456789abcdef",
        checkpoint_id=1,
        shard=0,
        transactional_id=f"eo.{name}.0",
        sink_topic=sink,
        staging_location=str(staged),
        parts=((0, files),),
        marker_group=f"eo-marker.{name}",
        group_id=None,
        group_offsets=(),
        kafka=tuple(sorted(config.items())),
        transaction_timeout_ms=30_000,
    )


@pytest.fixture()
def foreign(kafka_config: dict[str, Any]) -> Iterator[Callable[[str], Producer]]:
    """Open a transaction of another application (its own transactional id) on a sink
    partition and keep it open; aborted after the test if still open."""
    opened: list[Producer] = []

    def _open(topic: str) -> Producer:
        producer = Producer(
            {
                **kafka_config,
                "transactional.id": f"someone-else-{uuid.uuid4().hex[:8]}",
                "transaction.timeout.ms": 300_000,
            }
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, value=b"foreign", partition=0)
        producer.flush(30)
        stable, high = admin.sink_offsets(kafka_config, topic, 1)
        assert stable[0] < high[0]  # open: read_committed readers stop at its start
        opened.append(producer)
        return producer

    yield _open
    for producer in opened:
        try:
            producer.abort_transaction(30)
        except Exception:
            pass


def ours(config: Mapping[str, Any], sink: str) -> list[bytes]:
    """The values of our records a read_committed consumer sees."""
    return sorted(m.value() for m in read_sink(dict(config), sink) if m.value() != b"foreign")


def test_records_beyond_a_foreign_open_transaction_are_not_published_again(
    kafka_config: dict[str, Any],
    make_topic: Callable[..., str],
    foreign: Callable[[str], Producer],
    tmp_path: Path,
) -> None:
    sink = make_topic("sink", partitions=1)
    c = committable(kafka_config, sink, tmp_path / "staged")
    other = foreign(sink)  # opened first: our records land beyond its start
    assert commit_shard(c, Hooks(row=False)).records == RECORDS
    # The marker is lost (expired), the ledger shows a try: the retry reads the output back.
    lost = replace(c, marker_group=f"{c.marker_group}.expired")
    started = time.monotonic()
    with pytest.raises(ReadBackBlocked) as info:
        commit_shard(lost, Hooks(row=True))
    waited = time.monotonic() - started
    text = str(info.value)
    print(f"refused after {waited:.1f} s: {text}")
    assert f"{sink}[0]" in text and "last stable offset 0" in text
    assert f"high watermark {RECORDS + 2}" in text  # the foreign record, ours, our commit marker
    assert f"describe-producers --topic {sink} --partition 0" in text
    assert "Nothing was published" in text
    # Once the foreign transaction is over, the read-back finds the checkpoint: no republish.
    other.abort_transaction(30)
    result = commit_shard(lost, Hooks(row=True))
    assert result.skipped and result.records == 0
    assert ours(kafka_config, sink) == sorted(f"v{i}".encode() for i in range(RECORDS))


def test_a_foreign_transaction_opened_after_our_records_does_not_hold_the_read_back(
    kafka_config: dict[str, Any],
    make_topic: Callable[..., str],
    foreign: Callable[[str], Producer],
    tmp_path: Path,
) -> None:
    sink = make_topic("sink", partitions=1)
    c = committable(kafka_config, sink, tmp_path / "staged")
    assert commit_shard(c, Hooks(row=False)).records == RECORDS
    other = foreign(sink)  # opened after: everything of ours lies below its start
    lost = replace(c, marker_group=f"{c.marker_group}.expired")
    started = time.monotonic()
    result = commit_shard(lost, Hooks(row=True))
    decided = time.monotonic() - started
    assert result.skipped and result.records == 0
    assert decided < 10, decided  # not the 15 s a settle wait for the foreign transaction takes
    other.abort_transaction(30)
    assert ours(kafka_config, sink) == sorted(f"v{i}".encode() for i in range(RECORDS))
