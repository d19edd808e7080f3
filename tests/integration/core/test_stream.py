"""Streaming mode on real Kafka and Spark: ``eo stream`` as a child process under
continuous input, killed (inside a commit too) and restarted, stopped by SIGTERM, and held by
back-pressure."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import Child, wait_for
from eo_source_sink import assert_sink_is_source_exactly_once, sink_records_per_checkpoint

from airflow_provider_eo import names
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
PREPARED = CheckpointState.PREPARED


class Feed(threading.Thread):
    """Continuous keyed input ``k<i%keys>:<i>`` at about ``rate`` records/s until stopped."""

    def __init__(self, h: Any, rate: int = 60, keys: int = 9) -> None:
        super().__init__(daemon=True)
        self.h, self.rate, self.keys = h, rate, keys
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        producer = Producer({**self.h.config, "linger.ms": 5})
        topic = self.h.pipeline.source_topics[0]
        batch = max(1, self.rate // 10)
        while not self.halt.wait(0.1):  # the input's pace, not a synchronisation
            for _ in range(batch):
                key = f"k{self.sent % self.keys}"
                producer.produce(topic, key=key, value=f"{key}:{self.sent}".encode())
                self.sent += 1
            producer.poll(0)
        producer.flush(30)

    def stop(self) -> int:
        self.halt.set()
        self.join(60)
        return self.sent


def assert_order_per_key(h: Any, count: int) -> None:
    """``count`` distinct inputs in the sink, each key's in source order (the producer
    numbers records in send order; one key lives in one source partition)."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for msg in sorted(h.sink_records(), key=lambda m: (m.partition(), m.offset())):
        by_key[msg.key().decode()].append(int(msg.value().decode().split(":")[1]))
    seen = [i for seq in by_key.values() for i in seq]
    assert len(seen) == len(set(seen)) == count
    for key, seq in by_key.items():
        assert seq == sorted(seq), f"order of {key} broken"


def finish(child: Child, timeout: float = 180) -> tuple[int, list[dict[str, Any]], str]:
    out, err = child.communicate(timeout=timeout)
    parsed = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert child.returncode is not None
    return child.returncode, parsed, err.decode()


def committed_count(h: Any) -> int:
    """COMMITTED checkpoints so far (0 before the stream registered the pipeline)."""
    if h.pipeline.name not in {p.name for p in h.ledger.list_pipelines()}:
        return 0
    return sum(1 for c in h.ledger.list_checkpoints(h.pipeline.name) if c.state is CheckpointState.COMMITTED)


def caught_up(h: Any) -> bool:
    """Every source record is in a COMMITTED checkpoint."""
    parts = admin.partitions_of(h.config, h.pipeline.source_topics)
    tps = [(t, p) for t, ps in parts.items() for p in ps]
    ends = admin.list_offsets(h.config, tps, spec="latest")
    done: dict[Any, int] = {}
    for cp in h.ledger.list_checkpoints(h.pipeline.name):
        if cp.state is CheckpointState.COMMITTED:
            for r in cp.ranges:
                done[r.key] = r.end
    return all(done.get(tp, 0) >= end for tp, end in ends.items())


@dataclass(frozen=True)
class InFlight:
    """A commit a kill cut short, as the ledger and the sink show it afterwards."""

    checkpoint_id: int
    records: int  # the checkpoint's staged records
    owner: str | None  # the commit lease's holder
    shard_states: tuple[str, ...]  # ledger rows of the shards whose transaction had begun
    visible: int  # of its records, how many a read_committed consumer of the sink sees


def commit_in_flight(h: Any) -> InFlight | None:
    """The PREPARED checkpoint whose commit had begun when the stream died: a committer
    writes a shard's row (and takes the lease) before ``begin_transaction``, so a PREPARED
    checkpoint with shard rows is a commit that did not reach the ledger's COMMITTED."""
    for cp in h.ledger.list_checkpoints(h.pipeline.name):
        if cp.state is not PREPARED:
            continue
        row = h.ledger.get(h.pipeline.name, cp.checkpoint_id)
        if not row.shards:
            continue
        visible = sink_records_per_checkpoint(h.config, h.pipeline.sink_topic, h.pipeline.name)
        return InFlight(
            cp.checkpoint_id,
            row.records or 0,
            row.commit_owner,
            tuple(str(s.state.value) for s in row.shards),
            visible[cp.checkpoint_id],
        )
    return None


def test_stream_under_continuous_input_survives_sigkills_and_stops_on_sigterm(
    harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--interval 2 with a producer running throughout, three SIGKILLs, each restart resuming
    what the killed run left: one inside a commit's open Kafka transaction, one after the
    Kafka commit but before the ledger's (both at fault points, and shown so by the ledger
    and the sink afterwards), one at a random moment. Then SIGTERM while the stream is busy
    catching up exits 0 with nothing unfinished. After a last drain every source record is
    in the sink exactly once (by source position), per-key order kept, group offsets =
    ledger."""
    h = harness(source_partitions=3, sink_partitions=2, max_pending=2, max_records_per_checkpoint=2000)
    rng = random.Random()
    feed = Feed(h)
    feed.start()
    kills: list[tuple[str, InFlight | None]] = []

    def killed_at(step: str, hit: int) -> InFlight | None:
        """A stream that SIGKILLs itself the ``hit``-th time it reaches ``step``."""
        with monkeypatch.context() as m:
            m.setenv("EO_FAULT_HIT", str(hit))
            child = h.cli("stream", "--interval", "2", fault=step, action="kill", wait=False)
        wait_for(lambda: child.poll() is not None, f"the stream to die at {step}", timeout=240)
        _out, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, err.decode()[-3000:]
        assert f"injected fault at {step}: kill" in err.decode(), err.decode()[-3000:]
        site = commit_in_flight(h)
        # the lease is the killed run's own (its process); the restarted run, on this host,
        # takes it over at once since that process is gone
        process = names.lease_owner_process(site.owner or "") if site is not None else None
        assert site is None or (process is not None and process[1] == child.pid), (site, child.pid)
        return site

    try:
        # 1. Inside the commit: the transaction is open and records were produced.
        site = killed_at("commit.after_begin", hit=3)
        kills.append(("commit.after_begin", site))
        assert site is not None, site
        assert site.shard_states == ("PENDING",) and site.visible == 0 < site.records, site
        # 2. Kafka committed the checkpoint's transaction, the ledger has not: its output is
        #    visible while the ledger still says PREPARED (hit 1 is the resumed checkpoint).
        site = killed_at("commit.after_commit_txn", hit=2)
        kills.append(("commit.after_commit_txn", site))
        assert site is not None, site
        assert site.visible == site.records > 0, site
        # 3. A random moment after a commit.
        child = h.cli("stream", "--interval", "2", wait=False)
        target = committed_count(h) + 1
        wait_for(lambda t=target: committed_count(h) >= t, "a commit", timeout=180, child=child)
        time.sleep(rng.uniform(0.0, 2.0))  # the kill's random moment (not a synchronisation)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        kills.append(("random", commit_in_flight(h)))
        child = h.cli("stream", "--interval", "2", wait=False)
        target = committed_count(h) + 2
        wait_for(lambda: committed_count(h) >= target, "the restart to commit", timeout=180, child=child)
        total = feed.stop()
        unfinished_at_term = [c.checkpoint_id for c in h.ledger.list_checkpoints(h.pipeline.name)][-1:]
        child.send_signal(signal.SIGTERM)  # input still waiting: the stream is mid-checkpoint
        code, out, err = finish(child)
    finally:
        feed.stop()
    assert code == 0, err[-3000:]
    summary = out[-1]
    assert summary["reason"] == "signal" and summary["unfinished"] == [], summary
    assert all(line["state"] == "COMMITTED" for line in out[:-1])
    assert h.ledger.unfinished(h.pipeline.name) is None
    cps = h.ledger.list_checkpoints(h.pipeline.name)
    assert {c.state for c in cps} == {CheckpointState.COMMITTED}, [c.state for c in cps]
    by_stream = sum(r.end - r.start for c in cps for r in c.ranges)
    assert 0 < by_stream <= total
    # The input SIGTERM left unread: one drain, then the sink is the source.
    h.drain()
    assert caught_up(h)
    report = assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=total)
    h.assert_exactly_once(expected_records=total)  # also: group offsets equal the ledger
    assert_order_per_key(h, total)
    print(
        f"stream: {len(cps)} checkpoints, {by_stream} of {total} records committed by the stream, "
        f"the rest by the drain; sink {report.sink} = source {report.source}; kills: {kills}; "
        f"last id at SIGTERM: {unfinished_at_term}"
    )


def test_airflow_commit_mode_stops_planning_at_max_pending(harness: Callable[..., Any]) -> None:
    """--commit airflow with nobody committing: exactly max_pending checkpoints PREPARED,
    then only back-pressure waits although input is waiting; a later inline run commits
    them first (in order) and the rest exactly once."""
    h = harness(source_partitions=2, sink_partitions=2, max_pending=2, max_records_per_checkpoint=40)
    h.produce(200)
    child = h.cli("stream", "--interval", "1", "--commit", "airflow", wait=False)

    def prepared() -> list[int]:
        if h.pipeline.name not in {p.name for p in h.ledger.list_pipelines()}:
            return []
        return [c.checkpoint_id for c in h.ledger.list_checkpoints(h.pipeline.name) if c.state is PREPARED]

    wait_for(lambda: prepared() == [1, 2], "max_pending checkpoints PREPARED", timeout=180, child=child)
    # The property is that nothing more happens: watch five more intervals (not a sync).
    time.sleep(5.0)
    child.send_signal(signal.SIGTERM)
    code, out, err = finish(child)
    assert code == 0, err[-3000:]
    summary = out[-1]
    assert summary["checkpoints"] == 2 and summary["records"] == 80, summary
    assert summary["backpressure_waits"] >= 3 and summary["unfinished"] == [1, 2], summary
    assert summary["reason"] == "signal"
    assert all(line["commit_s"] is None and line["state"] == "PREPARED" for line in out[:-1])
    cps = h.ledger.list_checkpoints(h.pipeline.name)
    assert [(c.checkpoint_id, c.state) for c in cps] == [(1, PREPARED), (2, PREPARED)]
    # What the Airflow commit operator would do (core.commit, in order): exactly once.
    for cid in (1, 2):
        h.commit(cid)
    h.assert_exactly_once(expected_records=80)


def test_a_second_stream_is_refused_while_one_lives_and_stream_stop_ends_it(
    harness: Callable[..., Any],
) -> None:
    """One live run per pipeline: a second `eo stream` is refused naming the first (its pid);
    `eo stream-stop` (from another process, through the ledger) ends the first cleanly, after
    which a new stream starts at once and carries on exactly once."""
    h = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=50)
    h.produce(120)
    first = h.cli("stream", "--interval", "1", "--heartbeat", "1", wait=False)
    wait_for(lambda: committed_count(h) >= 1, "the first stream's commit", timeout=180, child=first)

    second = h.cli("stream", "--interval", "1", timeout=120)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "its streaming application already runs" in second.stderr, second.stderr
    assert f"pid {first.pid}" in second.stderr, second.stderr

    stop = h.cli("stream-stop")
    assert stop.returncode == 0, stop.stderr
    (asked,) = json.loads(stop.stdout.strip().splitlines()[-1])["stop_requested"]
    code, out, err = finish(first)
    assert code == 0, err[-3000:]
    summary = out[-1]
    assert summary["reason"].startswith("stop requested by") and summary["unfinished"] == [], summary
    assert summary["run_id"] == asked
    assert h.ledger.get_stream_run(asked).state == "ENDED"

    again = h.cli("stream", "--interval", "1", "--duration", "8", timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert h.ledger.unfinished(h.pipeline.name) is None
    h.assert_exactly_once(expected_records=120)
