"""Exactly-once output of Structured Streaming queries through ``KafkaExactlyOnceSink``: the
query runs in its own process (tests/eo_ss_query.py, ``availableNow``), is SIGKILLed at each
phase of a batch and restarted from the same checkpoint location; the sink is compared with
a recount of the source, never with the ledger's own numbers."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import poll_until, wait_for, with_group_gone

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink, read_topic, settled_ends
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

QUERY = Path(__file__).resolve().parents[2] / "eo_ss_query.py"
# The seed of the random kill moments (EO_SS_KILL_SEED to try others; where the kill lands
# also depends on the machine's speed).
SEED = int(os.environ.get("EO_SS_KILL_SEED", "5"))


class Query:
    """One query (its topics, ledger, staging and checkpoint location) run as a process."""

    def __init__(
        self, tmp_path: Path, config: dict[str, Any], make_topic: Callable[..., str], kind: str
    ) -> None:
        self.config = config
        self.source = make_topic("ss-src", partitions=2)
        self.sink = make_topic("ss-out", partitions=2)
        self.name = f"ss-{kind}-{uuid.uuid4().hex[:6]}"
        self.ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        self.spec = {
            "bootstrap": config["bootstrap.servers"],
            "source": self.source,
            "sink": self.sink,
            "name": self.name,
            "ledger_url": self.ledger_url,
            "staging_dir": str(tmp_path / "staging"),
            "checkpoint": str(tmp_path / "checkpoint"),
            "kind": kind,
            "commit_shards": 2,
            "max_offsets": 40,
        }
        self.logs = tmp_path

    def produce(self, records: list[tuple[str, str]]) -> None:
        producer = Producer(self.config)
        for i, (key, value) in enumerate(records):
            producer.produce(self.source, key=key, value=value, partition=i % 2)
        assert producer.flush(30) == 0

    def start(
        self, fault: str | None = None, hit: int = 1, **spec: Any
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """The query's process (its own session), and its log."""
        env = dict(os.environ)
        env.pop("EO_FAULT", None)
        if fault:
            env.update(EO_FAULT=fault, EO_FAULT_HIT=str(hit))
        if "run_id" in spec:
            env["EO_STREAM_RUN_ID"] = spec.pop("run_id")
        log = self.logs / f"run-{fault or 'clean'}-{uuid.uuid4().hex[:4]}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(QUERY), json.dumps({**self.spec, **spec})],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log

    def run(self, fault: str | None = None, hit: int = 1, **spec: Any) -> int:
        proc, log = self.start(fault, hit, **spec)
        try:
            code = proc.wait(timeout=300)
        finally:
            with_group_gone(proc)
        if fault is None:
            assert code == 0, log.read_text()[-4000:]
        else:
            assert code == -signal.SIGKILL, f"the fault {fault} did not fire:\n{log.read_text()[-4000:]}"
        return code

    def kill_at_a_random_moment(self, rng: random.Random) -> None:
        """Run the query on a 1 s trigger until it has committed one more batch, then SIGKILL
        its whole process group ``rng.uniform(0, 2)`` seconds later: in a batch, between the
        shards of a commit, between batches, wherever that lands."""
        before = len(self.committed())
        proc, log = self.start(trigger_s=1)
        try:
            wait_for(
                lambda: len(self.committed()) > before or proc.poll() is not None,
                "a batch committed by the run to kill",
                timeout=240,
            )
            assert proc.poll() is None, log.read_text()[-4000:]
            # Up to the random moment, watch that the query keeps running (it never exits
            # on its own on a processing-time trigger), then kill it wherever it is.
            exited = poll_until(lambda: proc.poll() is not None, timeout=rng.uniform(0, 2), interval=0.05)
            assert not exited, log.read_text()[-4000:]
        finally:
            with_group_gone(proc)

    def stream_run(self, run_id: str) -> Any:
        """The run's ledger row; None before the query registered it."""
        from airflow_provider_eo.ledger.streams import StreamRunNotFound

        with Ledger(self.ledger_url) as ledger:
            try:
                return ledger.get_stream_run(run_id)
            except StreamRunNotFound:
                return None

    def pipeline(self) -> Pipeline:
        return Pipeline(
            name=self.name,
            kafka=dict(self.config),
            source_topics=[self.source],
            sink_topic=self.sink,
            ledger_url=self.ledger_url,
        )

    def source_records(self) -> dict[tuple[int, int], tuple[str, str]]:
        """(partition, offset) -> (key, value) of every source record."""
        ends = settled_ends(self.config, [(self.source, 0), (self.source, 1)])
        out = {}
        for msg in read_topic(self.config, self.source, ends, isolation="read_committed"):
            out[(int(msg.partition()), int(msg.offset()))] = (msg.key().decode(), msg.value().decode())
        return out

    def sink_values(self) -> list[str]:
        return [m.value().decode() for m in read_sink(self.config, self.sink)]

    def committed(self) -> list[Any]:
        with Ledger(self.ledger_url) as ledger:
            return [c for c in ledger.list_checkpoints(self.name) if c.state is CheckpointState.COMMITTED]

    def check_group_and_audit(self) -> None:
        """The group sits at the last committed batch's ends (= the source's ends), and the
        audit finds every staged record of every batch exactly once in the sink."""
        last = max(self.committed(), key=lambda c: c.checkpoint_id)
        tps = [(self.source, 0), (self.source, 1)]
        group = admin.committed_group_offsets(self.config, f"eo.{self.name}", tps)
        assert group == {r.key: r.end for r in last.ranges} == settled_ends(self.config, tps)
        with Ledger(self.ledger_url) as ledger:
            report = audit_pipeline(self.pipeline(), ledger)
        assert report.ok and report.foreign == 0, report.as_dict()


def expected_count_updates(query: Query) -> Counter[str]:
    """The running count per key each committed batch emits in update mode, recounted from
    the source records of the batch's ranges (in batch order)."""
    source = query.source_records()
    running: Counter[str] = Counter()
    out: Counter[str] = Counter()
    for cp in sorted(query.committed(), key=lambda c: c.checkpoint_id):
        touched = set()
        for r in cp.ranges:
            for offset in range(r.start, r.end):
                key = source[(r.partition, offset)][0]
                running[key] += 1
                touched.add(key)
        out.update(f"{key}={running[key]}" for key in touched)
    return out


def test_running_count_killed_at_every_phase_is_published_exactly_once(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    query = Query(tmp_path, kafka_config, make_topic, "count")
    keys = [f"k{i % 7}" for i in range(160)]
    query.produce([(k, str(i)) for i, k in enumerate(keys)])
    # Each run dies in the first unfinished batch at the next phase; the next run resumes it.
    for fault, hit in [
        ("batch.before_stage", 1),  # PLANNED, nothing staged
        ("prepare.after_write", 1),  # staged, no manifest: the ledger still PLANNED
        ("commit.after_commit_txn", 1),  # one of two shards committed
        ("commit.before_ledger", 1),  # both shards committed, ledger PREPARED
        ("batch.after_commit", 2),  # batch 1 COMMITTED, Spark's commit log not written
    ]:
        query.run(fault, hit)
    query.produce([(k, str(i)) for i, k in enumerate(keys[:120], start=1000)])  # more after the kills
    rng = random.Random(SEED)
    query.kill_at_a_random_moment(rng)
    query.run()
    values = query.sink_values()
    assert Counter(values) == expected_count_updates(query)  # each update once, none missing
    assert not [v for v, n in Counter(values).items() if n > 1]
    last: dict[str, int] = {}
    for v in values:
        key, count = v.split("=")
        last[key] = max(last.get(key, 0), int(count))
    recount = Counter(k for k, _ in query.source_records().values())
    assert last == dict(recount)
    committed = query.committed()
    assert [c.batch_id for c in sorted(committed, key=lambda c: c.checkpoint_id)] == list(
        range(len(committed))
    )
    query.check_group_and_audit()


def test_nondeterministic_query_republishes_its_first_runs_staged_output_then_stops_on_request(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    query = Query(tmp_path, kafka_config, make_topic, "random")
    query.spec["max_offsets"] = 1000
    query.produce([(f"k{i % 5}", f"v{i}") for i in range(60)])
    # one shard of the batch published, then killed: its run stays RUNNING in the ledger
    query.run("commit.after_commit_txn", 1, run_id="killed")
    # the restart runs until a stop request (what `eo stream-stop` and a stopped Airflow task send)
    proc, log = query.start(run_id="live", trigger_s=1)
    try:
        wait_for(lambda: query.stream_run("live") is not None, "the restarted query's run", timeout=180)
        assert query.stream_run("live").state == "RUNNING"
        assert query.stream_run("killed").state == "LOST"  # declared so by the restart (its pid is gone)
        query.produce([(f"k{i % 5}", f"v{i}") for i in range(60, 90)])
        wait_for(
            lambda: sum(c.records or 0 for c in query.committed()) == 90,
            "the records produced while the query runs, committed",
            timeout=180,
        )
        with Ledger(query.ledger_url) as ledger:
            assert ledger.request_stream_stop(query.name, requested_by="the test") == ["live"]
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        with_group_gone(proc)
    run = query.stream_run("live")
    assert run.state == "ENDED" and run.reason == "stop requested by the test", run
    values = query.sink_values()
    assert sorted(v.split("|")[0] for v in values) == sorted(f"v{i}" for i in range(90))
    first = [v.split("|")[1] for v in values if int(v.split("|")[0][1:]) < 60]
    assert len(set(first)) == 1, f"the first batch was published from two runs: {Counter(first)}"
    query.check_group_and_audit()


def test_drop_duplicates_within_watermark_killed_mid_commit(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    query = Query(tmp_path, kafka_config, make_topic, "dedup")
    values = [f"v{i % 50}" for i in range(240)]  # each value four or five times, across batches
    query.produce([(f"k{i % 3}", v) for i, v in enumerate(values)])
    query.run("commit.before_ledger", 2)  # the second batch published, ledger not updated
    query.kill_at_a_random_moment(random.Random(SEED + 1))
    query.run()
    got = query.sink_values()
    assert Counter(got) == Counter(set(values)), Counter(got) - Counter(set(values))
    query.check_group_and_audit()


def test_start_again_with_another_checkpoint_location_loses_nothing(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], spark: Any
) -> None:
    """One sink object, its query started again in the same process from a new checkpoint
    location (a new query id, batch ids from 0 again): the new query is refused with the
    error that says so, or publishes each source record once; never recorded done unpublished.
    """
    from pyspark.errors import StreamingQueryException

    from airflow_provider_eo.streaming import KafkaExactlyOnceSink

    source = make_topic("ss-src", partitions=2)
    sink_topic = make_topic("ss-out", partitions=2)
    name = f"ss-again-{uuid.uuid4().hex[:6]}"
    sink = KafkaExactlyOnceSink(
        name=name,
        kafka={"bootstrap.servers": kafka_config["bootstrap.servers"]},
        sink_topic=sink_topic,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        commit_mode="local",
        heartbeat_s=1.0,
    )

    def produce(values: range) -> None:
        producer = Producer(kafka_config)
        for i in values:
            producer.produce(source, key=f"k{i % 5}", value=f"v{i}", partition=i % 2)
        assert producer.flush(30) == 0

    def run(location: str, starting: str = "earliest") -> StreamingQueryException | None:
        frame = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_config["bootstrap.servers"])
            .option("subscribe", source)
            .option("startingOffsets", starting)
            .load()
            .select("key", "value")
        )
        query = sink.start(frame, str(tmp_path / location), output_mode="append", available_now=True)
        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            return exc
        return None

    def sink_values() -> Counter[str]:
        return Counter(m.value().decode() for m in read_sink(kafka_config, sink_topic))

    produce(range(40))
    assert run("ckpt-a") is None
    assert sink_values() == Counter(f"v{i}" for i in range(40))
    produce(range(40, 80))
    refused = run("ckpt-b")
    if refused is not None:
        # The refusal names the two queries and what to do; the old location resumes.
        assert "QueryIdentityMismatch" in str(refused) and "another checkpoint location" in str(refused), (
            refused
        )
        assert run("ckpt-a") is None
    # Counted against the source: every record once, whichever way the new query went.
    expected, got = Counter(f"v{i}" for i in range(80)), sink_values()
    assert got == expected, f"missing {sorted(expected - got)}, duplicated {sorted(got - expected)}"

    # Told to take a new query in (allow_new_query): one that starts from the source's
    # earliest offsets is refused with the offsets to start from; started there, it continues
    # the pipeline, each record once.
    sink.allow_new_query = True
    produce(range(80, 100))
    refused = run("ckpt-c")
    assert refused is not None and "startingOffsets=" in str(refused), refused
    starting = re.search(r"startingOffsets=(\{.*?\}\})", str(refused))
    assert starting is not None and json.loads(starting.group(1)) == {source: {"0": 40, "1": 40}}, refused
    assert run("ckpt-d", starting.group(1)) is None
    expected, got = Counter(f"v{i}" for i in range(100)), sink_values()
    assert got == expected, f"missing {sorted(expected - got)}, duplicated {sorted(got - expected)}"
    sink.close()
