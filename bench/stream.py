"""Streaming benchmark: eo's streaming mode (inline commit) vs Spark Structured Streaming's own
at-least-once Kafka sink, same trigger interval, same input rate, same machine, one run.

    .venv/bin/python bench/stream.py [--interval 5] [--rate 1000] [--seconds 60] [--warmup 10]
                                     [--backlog 500000] [--partitions 4] [--max-pending 2]

One local broker (127.0.0.1) and one local SparkSession with the connector jars; every phase
has its own topics.

1. Latency, eo: ``run_stream`` (commit="inline", ``--interval``) runs in a thread of this
   process while a producer writes ``--rate`` records/s to its source for ``--warmup`` +
   ``--seconds`` seconds. Each record's key is its sequence number and its Kafka timestamp
   is the produce time; a ``read_committed`` consumer of the sink notes the wall-clock time
   each record arrives and matches it to the source timestamp by key. Latency = arrival -
   source timestamp, over the records produced after the warm-up: p50, p99, and the
   throughput (those records / the time from their first produce to their last arrival).
2. Latency, Spark: ``readStream`` kafka -> the same transform (``upper``) ->
   ``writeStream`` kafka, ``trigger(processingTime=--interval)``, measured the same way.
3. Max throughput, ``--rounds`` rounds (default 3): per round, ``--backlog`` records are
   written for each side first; then eo (``run_stream``, same interval) and Spark (same
   query shape, same trigger) each process their backlog from the start: records / seconds
   until the last record is readable (eo: the last commit returned; Spark: the sink's high
   watermarks reach the backlog, nothing is transactional). The side that goes first
   alternates per round; the medians over the rounds are reported. Before anything is
   measured, ``--warm-records`` (default: the backlog) go through each side once, so the
   JVM's JIT is warm for both (a 10k warm-up left the first large job 2-3x slower).
   Spark's query has no ``maxOffsetsPerTrigger``, so by default eo's
   ``max_records_per_checkpoint`` is the backlog too (one batch each); ``--max-records``
   caps eo's checkpoints (a capped plan plans the next at once: core/stream.py catch-up).

Progress goes to stderr; the last line on stdout is machine-readable.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_provider_eo.pipeline import Pipeline  # noqa: E402

TRANSFORM = "airflow_provider_eo.examples.transforms:upper"
PAD = "x" * 60


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy so far (``/proc/stat``: every process — the
    Spark JVM, this driver, the broker — not idle or waiting on I/O)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[stream {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Sent:
    """What the producer wrote: source timestamp (ms) per sequence number."""

    ts_ms: dict[int, int] = field(default_factory=dict)
    measured_from: int = 0  # first sequence number produced after the warm-up
    total: int = 0


def produce_at_rate(
    bootstrap: str, topic: str, rate: float, warmup_s: float, seconds: float, partitions: int, sent: Sent
) -> None:
    """``rate`` records/s for ``warmup_s + seconds``; timestamp = produce time, key = seq."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    started = time.monotonic()
    end = started + warmup_s + seconds
    seq = 0
    sent.measured_from = -1
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if sent.measured_from < 0 and now - started >= warmup_s:
            sent.measured_from = seq
        due = int((now - started) * rate)
        while seq < due:
            ts = int(time.time() * 1000)
            sent.ts_ms[seq] = ts
            p.produce(
                topic,
                key=str(seq).encode(),
                value=f'{{"seq":{seq:09d},"pad":"{PAD}"}}'.encode(),
                partition=seq % partitions,
                timestamp=ts,
            )
            seq += 1
        p.poll(0)
        time.sleep(0.005)
    if sent.measured_from < 0:
        sent.measured_from = seq
    sent.total = seq
    p.flush(60)


def produce_backlog(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for i in range(n):
        while True:
            try:
                p.produce(
                    topic,
                    key=str(i).encode(),
                    value=f'{{"seq":{i:09d},"pad":"{PAD}"}}'.encode(),
                    partition=i % partitions,
                )
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


class SinkWatcher(threading.Thread):
    """A read_committed consumer of the sink: arrival wall-clock time per sequence number."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name=f"sink-{topic}", daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",  # what a downstream reader would see
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,  # small: the arrival time is the measurement
            }
        )
        self.consumer.subscribe([topic])
        self.arrived: dict[int, float] = {}
        self.duplicates = 0
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msgs = self.consumer.consume(10_000, timeout=0.05)
                now = time.time()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    seq = int(m.key() or b"-1")
                    if seq in self.arrived:
                        self.duplicates += 1
                    else:
                        self.arrived[seq] = now
        finally:
            self.consumer.close()


@dataclass
class Latency:
    p50_s: float
    p99_s: float
    rps: float
    measured: int
    missing: int
    duplicates: int


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def measure_latency(
    name: str,
    bootstrap: str,
    src: str,
    sink: str,
    args: argparse.Namespace,
    drain_s: float,
) -> Latency:
    """Produce at ``args.rate``, watch the sink, wait (bounded) for every record; the caller
    has started the system under test on ``src`` -> ``sink``."""
    sent = Sent()
    watcher = SinkWatcher(bootstrap, sink)
    watcher.start()
    producer = threading.Thread(
        target=produce_at_rate,
        args=(bootstrap, src, args.rate, args.warmup, args.seconds, args.partitions, sent),
        name="producer",
        daemon=True,
    )
    t0 = time.monotonic()
    producer.start()
    try:
        while producer.is_alive():
            producer.join(timeout=5)
            log(
                f"  {name}: {time.monotonic() - t0:5.0f}s produced {len(sent.ts_ms):,} "
                f"readable {len(watcher.arrived):,}"
            )
        deadline = time.monotonic() + drain_s
        while len(watcher.arrived) < sent.total and time.monotonic() < deadline:
            time.sleep(0.2)
        log(f"  {name}: produced {sent.total:,}, readable {len(watcher.arrived):,}")
    finally:
        watcher.stop.set()
        watcher.join(timeout=10)
    wanted = range(sent.measured_from, sent.total)
    lat = [watcher.arrived[s] - sent.ts_ms[s] / 1000 for s in wanted if s in watcher.arrived]
    missing = len(wanted) - len(lat)
    if not lat:
        raise SystemExit(f"{name}: no measured record became readable")
    first = sent.ts_ms[sent.measured_from] / 1000
    last = max(watcher.arrived[s] for s in wanted if s in watcher.arrived)
    rps = len(lat) / (last - first)
    return Latency(pct(lat, 0.5), pct(lat, 0.99), rps, len(lat), missing, watcher.duplicates)


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex[:8]}"})
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)]
        return sum(high for _, high in marks)
    finally:
        c.close()


def spark_query(
    spark: Any, bootstrap: str, src: str, sink: str, checkpoint_dir: Path, interval: float
) -> Any:
    """Spark's own pipeline: readStream kafka -> upper -> writeStream kafka (at-least-once)."""
    from airflow_provider_eo.examples.transforms import upper

    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .load()
    )
    return (
        upper(df)
        .select("key", "value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(processingTime=f"{interval} seconds")
        .start()
    )


def warm_up(
    spark: Any, ledger: Any, base: Pipeline, bootstrap: str, work: Path, partitions: int, records: int
) -> None:
    """``records`` through eo (one checkpoint) and through one Spark streaming batch (JIT, the
    Kafka connector, the broker's transaction and offsets topics) before anything is measured.

    The same size as the measured backlog by default: after a 10k-record warm-up, the first
    500k-record job of a JVM ran 2-3x slower than the next ones (13.4 s, then 3.8-4.0 s for
    the same staged write; HotSpot still compiling on two cores), and whichever side went
    first paid for it — eo, in the order of the phases.
    """
    from airflow_provider_eo.core.runner import run_once

    log(f"warming up: {records:,} records through eo (one checkpoint) and through a Spark streaming query")
    produce_backlog(bootstrap, "warm-eo", records, partitions)
    produce_backlog(bootstrap, "warm-spark", records, partitions)
    run_once(
        replace(
            base,
            name="warm",
            source_topics=["warm-eo"],
            sink_topic="warm-eo-sink",
            max_records_per_checkpoint=max(records, base.max_records_per_checkpoint),
        ),
        ledger=ledger,
        spark=spark,
    )
    q = spark_query(spark, bootstrap, "warm-spark", "warm-spark-sink", work / "spark-warm-ckpt", 1.0)
    try:
        deadline = time.monotonic() + 120
        while (
            high_watermarks(bootstrap, "warm-spark-sink", partitions) < records
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    finally:
        q.stop()


class EoStream:
    """``run_stream`` in a thread (signals are the main thread's: the benchmark stops it)."""

    def __init__(self, pipeline: Pipeline, ledger: Any, spark: Any, interval: float) -> None:
        from airflow_provider_eo.core.stream import StreamCheckpoint

        self.stop = threading.Event()
        self.checkpoints: list[StreamCheckpoint] = []
        self.records = 0
        self.error: BaseException | None = None
        self.result: Any = None

        def on_checkpoint(cp: StreamCheckpoint) -> None:
            self.checkpoints.append(cp)
            self.records += cp.records
            log(
                f"    eo checkpoint {cp.checkpoint_id}: {cp.records:,} records, prepare "
                f"{cp.prepare_s or 0:.2f}s, commit {cp.commit_s or 0:.2f}s, planned->committed "
                f"{cp.done_at - cp.planned_at:.2f}s"
            )

        def run() -> None:
            from airflow_provider_eo.core.stream import run_stream

            try:
                self.result = run_stream(
                    pipeline,
                    interval_s=interval,
                    commit="inline",
                    ledger=ledger,
                    spark=spark,
                    stop=self.stop,
                    on_checkpoint=on_checkpoint,
                )
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, name="eo-stream", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=300)
        if self.error is not None:
            raise self.error

    def phases(self) -> str:
        cps = [c for c in self.checkpoints if c.records]
        if not cps:
            return "no checkpoints"
        prep = [c.prepare_s or 0.0 for c in cps]
        com = [c.commit_s or 0.0 for c in cps]
        total = [c.done_at - c.planned_at for c in cps]
        waits = self.result.backpressure_waits if self.result is not None else "?"
        return (
            f"{len(cps)} checkpoints, median records {statistics.median(c.records for c in cps):,.0f}, "
            f"prepare median {statistics.median(prep):.2f}s max {max(prep):.2f}s, commit median "
            f"{statistics.median(com):.2f}s max {max(com):.2f}s, planned->committed median "
            f"{statistics.median(total):.2f}s, backpressure_waits {waits}"
        )


def latency_phases(
    spark: Any,
    ledger: Any,
    base: Pipeline,
    bootstrap: str,
    work: Path,
    args: argparse.Namespace,
    running: list[Any],
) -> tuple[Latency, Latency]:
    """Phases 1 and 2: eo's stream, then Spark's query, each at ``args.rate`` records/s."""
    log(f"(a) eo stream, inline commit, interval {args.interval}s, {args.rate:g} records/s")
    eo = EoStream(base, ledger, spark, args.interval)
    running.append(eo)
    eo.start()
    eo_lat = measure_latency("eo", bootstrap, "src-eo", "sink-eo", args, 60.0 + 4 * args.interval)
    eo.end()
    running.remove(eo)
    log(f"  eo phases: {eo.phases()}")

    log(f"(b) Spark Structured Streaming -> Kafka sink, trigger {args.interval}s, {args.rate:g} rec/s")
    q = spark_query(spark, bootstrap, "src-spark", "sink-spark", work / "spark-ckpt", args.interval)
    running.append(q)
    spark_lat = measure_latency("spark", bootstrap, "src-spark", "sink-spark", args, 60.0 + 4 * args.interval)
    q.stop()
    running.remove(q)
    for name, lt in (("eo", eo_lat), ("spark", spark_lat)):
        log(
            f"  {name}: p50 {lt.p50_s:.2f}s p99 {lt.p99_s:.2f}s, {lt.rps:,.0f} records/s over "
            f"{lt.measured:,} records, missing {lt.missing}, duplicates {lt.duplicates}"
        )
    return eo_lat, spark_lat


def throughput_round(
    spark: Any,
    ledger: Any,
    base: Pipeline,
    bootstrap: str,
    work: Path,
    args: argparse.Namespace,
    running: list[Any],
    i: int,
    sides: tuple[str, str],
) -> dict[str, float]:
    """Phase 3, round ``i``: a fresh backlog of ``args.backlog`` records for each side (own
    topics), then each side in the order ``sides`` carries it; records/s per side."""
    from e2e import settle  # bench/ is the script's folder

    from airflow_provider_eo.kafka import admin

    log(f"max throughput, round {i}: producing a backlog of {args.backlog:,} records twice")
    conf = {"bootstrap.servers": bootstrap}
    for side in ("eo", "spark"):
        for t in (f"bl{i}-{side}", f"bl{i}-{side}-sink"):
            admin.ensure_topic(conf, t, partitions=args.partitions)
        produce_backlog(bootstrap, f"bl{i}-{side}", args.backlog, args.partitions)
    rates: dict[str, float] = {}
    for side in sides:
        settle()
        if side == "eo":
            log(f"(a) round {i}: eo stream over the backlog")
            bl = replace(
                base,
                name=f"bench-stream-backlog-{i}",
                source_topics=[f"bl{i}-eo"],
                sink_topic=f"bl{i}-eo-sink",
            )
            eo = EoStream(bl, ledger, spark, args.interval)
            running.append(eo)
            t0, cpu0 = time.monotonic(), machine_cpu_s()
            eo.start()
            while eo.records < args.backlog and eo.thread.is_alive():
                time.sleep(0.05)
            eo_s, cpu = time.monotonic() - t0, machine_cpu_s() - cpu0
            eo.end()
            running.remove(eo)
            log(
                f"  eo: {eo.records:,} records in {eo_s:.2f}s, machine CPU {cpu:.2f}s "
                f"({cpu / eo.records * 1e6:.1f} us/record); {eo.phases()}"
            )
            rates["eo"] = eo.records / eo_s
        else:
            log(f"(b) round {i}: Spark over the backlog")
            t0, cpu0 = time.monotonic(), machine_cpu_s()
            q = spark_query(
                spark,
                bootstrap,
                f"bl{i}-spark",
                f"bl{i}-spark-sink",
                work / f"spark-bl{i}-ckpt",
                args.interval,
            )
            running.append(q)
            last_log = t0
            while (hw := high_watermarks(bootstrap, f"bl{i}-spark-sink", args.partitions)) < args.backlog:
                if time.monotonic() - last_log > 5:
                    last_log = time.monotonic()
                    log(f"  spark: {hw:,} records written")
                time.sleep(0.05)
            spark_s, cpu = time.monotonic() - t0, machine_cpu_s() - cpu0
            q.stop()
            running.remove(q)
            log(
                f"  spark: {args.backlog:,} records in {spark_s:.2f}s, machine CPU {cpu:.2f}s "
                f"({cpu / args.backlog * 1e6:.1f} us/record)"
            )
            rates["spark"] = args.backlog / spark_s
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=5.0, help="trigger interval, seconds (both)")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s during the latency phases")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per latency phase")
    ap.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds before those")
    ap.add_argument("--backlog", type=int, default=500_000, help="records for the max-throughput phase")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-pending", type=int, default=2, help="eo: unfinished checkpoints at once")
    ap.add_argument(
        "--max-records",
        type=int,
        default=None,
        help="eo: max_records_per_checkpoint (default: the backlog, so that eo, like Spark's "
        "uncapped query, takes the backlog in one batch)",
    )
    ap.add_argument(
        "--warm-records",
        type=int,
        default=None,
        help="records through each side before anything is measured (default: --backlog)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="max-throughput rounds (each side once per round, the first side alternating); "
        "the medians are reported",
    )
    ap.add_argument("--skip-latency", action="store_true", help="only the max-throughput phase")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still runs

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"stream-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    spark = None
    ledger = None
    running: list[Any] = []  # Spark queries / eo streams to stop on the way out
    log("starting a broker")
    bootstrap = kafka.up().bootstrap
    try:
        conf = {"bootstrap.servers": bootstrap}
        for side in ("eo", "spark"):
            for t in (
                f"src-{side}",
                f"sink-{side}",
                f"warm-{side}",
                f"warm-{side}-sink",
            ):
                admin.ensure_topic(conf, t, partitions=args.partitions)
        log("starting Spark")
        spark = get_spark("eo-bench-stream", {"spark.ui.showConsoleProgress": "false"})
        ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
        base = Pipeline(
            name="bench-stream",
            kafka=conf,
            source_topics=["src-eo"],
            sink_topic="sink-eo",
            transform=TRANSFORM,
            ledger_url=f"sqlite:///{work / 'ledger.db'}",
            staging_dir=str(work / "staging"),
            max_records_per_checkpoint=args.max_records or max(args.backlog, 100_000),
            max_pending=args.max_pending,
        )

        warm_up(spark, ledger, base, bootstrap, work, args.partitions, args.warm_records or args.backlog)
        eo_lat = spark_lat = None
        if not args.skip_latency:
            eo_lat, spark_lat = latency_phases(spark, ledger, base, bootstrap, work, args, running)
        eo_rounds: list[float] = []
        spark_rounds: list[float] = []
        for i in range(1, args.rounds + 1):
            # Alternate which side goes first, so neither is billed for the other's leftovers.
            sides = ("eo", "spark") if i % 2 else ("spark", "eo")
            rates = throughput_round(spark, ledger, base, bootstrap, work, args, running, i, sides)
            eo_rounds.append(rates["eo"])
            spark_rounds.append(rates["spark"])
            log(
                f"  round {i}/{args.rounds}: eo {rates['eo']:,.0f} records/s, spark "
                f"{rates['spark']:,.0f} records/s ({rates['eo'] / rates['spark']:.2f}x)"
            )
        eo_rps, spark_rps = statistics.median(eo_rounds), statistics.median(spark_rounds)
        log(
            f"max throughput over {args.rounds} round(s), median: eo {eo_rps:,.0f}, spark "
            f"{spark_rps:,.0f} records/s (eo rounds {[round(r) for r in eo_rounds]}, spark rounds "
            f"{[round(r) for r in spark_rounds]})"
        )
    finally:
        for r in running:
            try:
                r.end() if isinstance(r, EoStream) else r.stop()
            except BaseException as exc:  # stopping on the way out: say it, keep stopping
                log(f"  stopping {r}: {exc}")
        if ledger is not None:
            ledger.close()
        if spark is not None:
            spark.stop()
        kafka.wipe()
        shutil.rmtree(work, ignore_errors=True)
    if eo_lat is not None:
        ok = eo_lat.p50_s <= args.interval + 2
        log(
            f"target: eo p50 {eo_lat.p50_s:.2f}s <= interval + 2 = {args.interval + 2:g}s: "
            f"{'yes' if ok else 'NO'}"
        )
    ok = eo_rps >= 0.8 * spark_rps
    log(
        f"target: eo max {eo_rps:,.0f} >= 0.8 x spark {spark_rps:,.0f} = {0.8 * spark_rps:,.0f}: "
        f"{'yes' if ok else 'NO'}"
    )

    def f(lt: Latency | None, what: str) -> str:
        return "-" if lt is None else f"{getattr(lt, what):.2f}"

    print(
        f"stream: interval_s={args.interval:g} rate={args.rate:g} eo_p50_s={f(eo_lat, 'p50_s')} "
        f"eo_p99_s={f(eo_lat, 'p99_s')} spark_p50_s={f(spark_lat, 'p50_s')} "
        f"spark_p99_s={f(spark_lat, 'p99_s')} eo_max_rps={eo_rps:.0f} spark_max_rps={spark_rps:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
