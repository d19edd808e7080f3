"""A shard whose publish outlives ``transaction.timeout.ms`` on a real broker.

The broker aborts such a transaction and fences its producer; librdkafka then reports the
producer as fenced "by a newer instance". The commit must say what really happened (the
timeout, with the numbers and what to change) instead of blaming another committer, must not
redo the same size in a loop, and nothing of the aborted transaction may be visible. And plan
must size checkpoints so that, at the publish rate the ledger measured, a commit never gets
there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from eo_fake_kafka import write_staged
from eo_harness import Harness, wait_for

from airflow_provider_eo.core.commit import commit_checkpoint
from airflow_provider_eo.core.shard import RealKafka, ShardCommittable, commit_shard
from airflow_provider_eo.errors import TransactionTimedOut
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink, read_topic
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka]

RECORDS = 50
STALL_AFTER = 10  # records sent before the publish stalls


class Hooks:
    """No ledger: a first try, nothing to read back."""

    def may_have_published(self) -> bool:
        return False

    def before_begin(self) -> None:
        pass

    def committed(self, records: int) -> None:
        pass


class Stalling:
    """A producer whose publish stalls after :data:`STALL_AFTER` records until the broker has
    aborted its open transaction for its timeout (what a publish slower than
    ``transaction.timeout.ms`` meets), then goes on."""

    def __init__(self, producer: Any, config: Mapping[str, Any], topic: str) -> None:
        self._producer = producer
        self._config = config
        self._topic = topic
        self.sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._producer.produce(*args, **kwargs)
        self.sent += 1
        if self.sent == STALL_AFTER:
            self._producer.poll(0)
            # Open: the records are on the broker, not stable. Then aborted: stable again.
            wait_for(lambda: self._stable_and_high()[0] < self._stable_and_high()[1], "records in flight")
            wait_for(lambda: self._stable_and_high()[0] == self._stable_and_high()[1], "the broker's abort")

    def _stable_and_high(self) -> tuple[int, int]:
        stable, high = admin.sink_offsets(self._config, self._topic, 1)
        return stable[0], high[0]


class StallingKafka(RealKafka):
    """The real cluster, with producers that stall (:class:`Stalling`)."""

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        super().__init__(config)
        self.topic = topic
        self.producers: list[Stalling] = []

    def producer(self, *args: Any, **kwargs: Any) -> Any:
        made = Stalling(super().producer(*args, **kwargs), self.config, self.topic)
        self.producers.append(made)
        return made


def committable(config: Mapping[str, Any], sink: str, staged: Path, *, timeout_ms: int) -> ShardCommittable:
    files = (write_staged(staged, 0, [f"v{i}".encode() for i in range(RECORDS)]),)
    return ShardCommittable(
        pipeline="slow",
        identity="0123456789abcdef",
        checkpoint_id=1,
        shard=0,
        transactional_id=f"eo.slow-{sink}.0",
        sink_topic=sink,
        staging_location=str(staged),
        parts=((0, files),),
        marker_group=f"eo-marker.slow-{sink}",
        group_id=None,
        group_offsets=(),
        kafka=tuple(sorted(config.items())),
        transaction_timeout_ms=timeout_ms,
    )


def test_a_publish_past_the_transaction_timeout_fails_by_name_and_publishes_nothing(
    kafka_config: dict[str, Any], make_topic: Callable[..., str], tmp_path: Path
) -> None:
    sink = make_topic("sink", partitions=1)
    c = committable(kafka_config, sink, tmp_path / f"staged-{uuid.uuid4().hex[:6]}", timeout_ms=2000)
    clients = StallingKafka(kafka_config, sink)
    started = time.monotonic()
    with pytest.raises(TransactionTimedOut) as info:
        commit_shard(c, Hooks(), clients)
    took = time.monotonic() - started
    text = str(info.value)
    print(f"timed out after {took:.1f} s: {text}")
    assert f"'eo.slow-{sink}.0' was open" in text and "transaction.timeout.ms (2000 ms)" in text
    assert f"of the shard's {RECORDS} records" in text
    assert "transaction_timeout_ms" in text and "max_records_per_checkpoint" in text
    assert len(clients.producers) == 1  # one round: no redo of the same size
    # The stalled records reached the broker and were aborted: none is visible.
    stable, high = admin.sink_offsets(kafka_config, sink, 1)
    assert stable == high and high[0] > STALL_AFTER
    everything = read_topic(kafka_config, sink, {(sink, 0): high[0]}, isolation="read_uncommitted")
    assert len(everything) >= STALL_AFTER
    assert read_sink(kafka_config, sink) == []
    # What the error says to do works: a longer timeout publishes the shard exactly once.
    longer = committable(kafka_config, sink, Path(c.staging_location), timeout_ms=60_000)
    result = commit_shard(longer, Hooks())
    assert result.records == RECORDS
    assert sorted(m.value() for m in read_sink(kafka_config, sink)) == sorted(
        f"v{i}".encode() for i in range(RECORDS)
    )


# -- plan sizes checkpoints to the measured publish rate ----------------------------------------

LINK_RATE = 500  # records/s the throttled commit producers send
TIMEOUT_MS = 2000


class Paced:
    """A producer held to ``rate`` records/s (a slow link to the sink)."""

    def __init__(self, producer: Any, rate: float) -> None:
        self._producer = producer
        self._rate = rate
        self._started: float | None = None
        self._sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def begin_transaction(self, *args: Any, **kwargs: Any) -> Any:
        # Paced per transaction: a producer the commit kept is reused by the next checkpoint
        # (equal clients share idle producers), and must not send that one's records at once.
        self._started, self._sent = None, 0
        return self._producer.begin_transaction(*args, **kwargs)

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if self._started is None:
            self._started = time.monotonic()
        self._producer.produce(*args, **kwargs)
        self._sent += 1
        ahead = self._sent / self._rate - (time.monotonic() - self._started)
        if ahead > 0:
            time.sleep(ahead)  # the link's pace, not a wait for another party


class SlowLink(RealKafka):
    """The real cluster behind a slow link (:class:`Paced` producers)."""

    def producer(self, *args: Any, **kwargs: Any) -> Any:
        return Paced(super().producer(*args, **kwargs), LINK_RATE)


@pytest.fixture()
def prompt_abort_kafka(kafka_config: dict[str, Any]) -> dict[str, Any]:
    """The session broker: it aborts a transaction past its timeout within half a second
    (tests/conftest.py; the default check runs every 10 s), so a commit too large for the
    timeout always fails."""
    return kafka_config


@pytest.mark.spark
def test_plan_sizes_checkpoints_so_a_slow_commit_fits_the_transaction_timeout(
    prompt_abort_kafka: dict[str, Any], spark: Any, tmp_path: Path
) -> None:
    """A sink 500 records/s away and a 2 s transaction timeout. The first checkpoint (300
    records) measures the rate; the 2,000 records then waiting would take 4 s in one
    transaction (the broker aborts it at 2 s), so plan cuts them into checkpoints that each
    publish within about 1 s, and every commit succeeds."""
    config = prompt_abort_kafka
    source, sink = f"src-{uuid.uuid4().hex[:8]}", f"sink-{uuid.uuid4().hex[:8]}"
    admin.ensure_topic(config, source, partitions=1)
    admin.ensure_topic(config, sink, partitions=1)
    pipeline = Pipeline(
        name=f"sized-{uuid.uuid4().hex[:8]}",
        kafka=dict(config),
        source_topics=[source],
        sink_topic=sink,
        transform="eo_test_transforms:identity",
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        transaction_timeout_ms=TIMEOUT_MS,
    )
    h = Harness(pipeline, dict(config), spark)
    try:

        def cycle() -> int:
            """Plan, prepare and commit (over the slow link) one checkpoint: its offsets."""
            cp = h.plan()
            if cp is None:
                return 0
            h.prepare(cp.checkpoint_id)
            commit_checkpoint(pipeline, h.ledger, cp.checkpoint_id, clients=SlowLink.of(pipeline.kafka))
            return sum(r.end - r.start for r in cp.ranges)

        h.produce(300)
        assert cycle() == 300  # nothing measured yet: 5,000 offsets/s assumed, 5,000 allowed
        h.produce(2000, start=300)
        sizes = []
        while size := cycle():
            sizes.append(size)
        print(f"checkpoints after the first: {sizes}")
        assert sum(sizes) == 2000 and len(sizes) >= 3
        assert max(sizes) <= LINK_RATE * TIMEOUT_MS / 1000 * 0.5  # each within half the timeout
        h.assert_exactly_once(expected_records=2300)
    finally:
        h.ledger.close()
