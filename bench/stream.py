"""Streaming benchmark: eo's streaming mode (inline commit) vs Spark Structured Streaming's own
at-least-once Kafka sink, same trigger interval, same input rate, same machine, one run.

    .venv/bin/python bench/stream.py [--interval 5] [--rate 1000] [--seconds 60] [--warmup 10]
                                     [--backlog 500000] [--partitions 4] [--max-pending 2]
                                     [--rounds 3] [--warm-passes 5] [--warm-small-seconds 20]
                                     [--spark-fetch-max-wait-ms MS]
                                     [--cases INTERVAL:MAX_RECORDS,...]

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
3. Max throughput, ``--rounds`` rounds (default 3): per round, ``--backlog`` more records
   are written to each side's source first; then eo (``run_stream``, same interval) and
   Spark (same query shape, same trigger) each restart and carry that backlog: records /
   seconds until the last record is readable (eo: the last commit returned; Spark: the
   high watermarks of a sink topic new to the pass reach it, nothing is transactional;
   the query is stopped only once its batch is committed, else its restart re-runs the
   batch, and a pass whose sink got more than the backlog says so). Every round uses the
   same source topics, eo pipeline and Spark checkpoint folder: a restart of one
   long-running job. The
   side that goes first alternates per round; the medians over the rounds are reported.
   Before anything is measured, ``--warm-small-seconds`` (default 20) of small checkpoints
   per side at a 1 s interval, then ``--warm-passes`` (default 5) unmeasured rounds warm the
   one JVM both sides share (see :func:`throughput_round`; its JIT kept compiling for four
   500k-record passes, and compiled the large checkpoint's code again after the first small
   checkpoints), and every measured side reports the JIT and GC seconds it still paid.
   Spark's query has no ``maxOffsetsPerTrigger``, so by default eo's
   ``max_records_per_checkpoint`` is the backlog too (one batch each); ``--max-records``
   caps eo's checkpoints (a capped plan plans the next at once: core/stream.py catch-up);
   ``--spark-max-offsets`` caps Spark's micro-batches the same way.
   eo's bounded reads set ``kafka.fetch.max.wait.ms`` to 20 ms (spark/source.py);
   ``--spark-fetch-max-wait-ms 20`` gives Spark's query the same (default: Spark's 500).

4. ``--cases "5:0,1:0,5:125000"`` runs phases 1-3 once per interval/checkpoint-cap case (0:
   the backlog), one after the other in the same JVM, and prints one line per case:
   ``stream_case: interval_s= max_records= eo_p50_s= spark_p50_s= eo_rps= spark_rps=``.

Progress goes to stderr; the last line on stdout is machine-readable (the first case's).
"""

from __future__ import annotations

import argparse
import functools
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
#: Extra source options of Spark's own query (``--spark-fetch-max-wait-ms``,
#: ``--spark-max-offsets``).
SPARK_SOURCE_OPTIONS: dict[str, str] = {}
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
        .options(**SPARK_SOURCE_OPTIONS)
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


def jit_compile_s(spark: Any) -> float:
    """Seconds the Spark JVM's JIT compilers have spent so far (JMX CompilationMXBean)."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    return float(bean.getTotalCompilationTime()) / 1000.0


def jvm_gc_s(spark: Any) -> float:
    """Seconds the Spark JVM's garbage collectors have spent so far (JMX)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return sum(max(0, b.getCollectionTime()) for b in beans) / 1000.0


def pass_counters(spark: Any) -> tuple[float, float, float, float]:
    """(wall clock, machine CPU, JIT, GC) seconds so far: a measured pass's start, and with
    the differences at its end what the pass took."""
    return time.monotonic(), machine_cpu_s(), jit_compile_s(spark), jvm_gc_s(spark)


def pass_took(spark: Any, start: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    """What a pass that began at ``start`` (:func:`pass_counters`) took so far, in each."""
    wall, cpu, jit, gc = pass_counters(spark)
    return wall - start[0], cpu - start[1], jit - start[2], gc - start[3]


def jvm_state(spark: Any) -> str:
    """The Spark JVM's heap in use and live threads, and this process's Python threads: what
    a phase may leave behind for the next."""
    mf = spark._jvm.java.lang.management.ManagementFactory
    heap = mf.getMemoryMXBean().getHeapMemoryUsage().getUsed() / 2**20
    return (
        f"heap {heap:,.0f} MiB, JVM threads {mf.getThreadMXBean().getThreadCount()}, "
        f"Python threads {threading.active_count()}"
    )


class InThread:
    """A system under test running in a daemon thread (:meth:`run`): :meth:`end` sets
    ``stop``, waits for the thread and re-raises what it raised."""

    def __init__(self, name: str) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._guarded, name=name, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def _guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=300)
        if self.error is not None:
            raise self.error


class EoStream(InThread):
    """``run_stream`` in a thread (signals are the main thread's: the benchmark stops it)."""

    def __init__(self, pipeline: Pipeline, ledger: Any, spark: Any, interval: float) -> None:
        from airflow_provider_eo.core.stream import StreamCheckpoint

        super().__init__("eo-stream")
        self.pipeline, self.ledger, self.spark, self.interval = pipeline, ledger, spark, interval
        self.checkpoints: list[StreamCheckpoint] = []
        self.records = 0
        self.result: Any = None

    def on_checkpoint(self, cp: Any) -> None:
        self.checkpoints.append(cp)
        self.records += cp.records
        log(
            f"    eo checkpoint {cp.checkpoint_id}: {cp.records:,} records, prepare "
            f"{cp.prepare_s or 0:.2f}s, commit {cp.commit_s or 0:.2f}s, planned->committed "
            f"{cp.done_at - cp.planned_at:.2f}s"
        )

    def run(self) -> None:
        from airflow_provider_eo.core.stream import run_stream
        from airflow_provider_eo.spark.stager import SparkStager

        self.result = run_stream(
            self.pipeline,
            interval_s=self.interval,
            commit="inline",
            ledger=self.ledger,
            stager=SparkStager(self.spark),
            stop=self.stop,
            on_checkpoint=self.on_checkpoint,
        )

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
    suffix: str = "",
) -> tuple[Latency, Latency]:
    """Phases 1 and 2: eo's stream, then Spark's query, each at ``args.rate`` records/s
    (topics ``src-eo{suffix}`` ...: records are matched by their sequence number, so each
    case's latency phases have topics of their own)."""
    from airflow_provider_eo.kafka import admin

    for t in ("src-eo", "sink-eo", "src-spark", "sink-spark"):
        admin.ensure_topic({"bootstrap.servers": bootstrap}, t + suffix, partitions=args.partitions)
    if suffix:
        base = replace(
            base, name=base.name + suffix, source_topics=["src-eo" + suffix], sink_topic="sink-eo" + suffix
        )
    log(f"(a) eo stream, inline commit, interval {args.interval}s, {args.rate:g} records/s")
    eo = EoStream(base, ledger, spark, args.interval)
    running.append(eo)
    eo.start()
    eo_lat = measure_latency(
        "eo", bootstrap, "src-eo" + suffix, "sink-eo" + suffix, args, 60.0 + 4 * args.interval
    )
    eo.end()
    running.remove(eo)
    log(f"  eo phases: {eo.phases()}")

    log(f"(b) Spark Structured Streaming -> Kafka sink, trigger {args.interval}s, {args.rate:g} rec/s")
    q = spark_query(
        spark,
        bootstrap,
        "src-spark" + suffix,
        "sink-spark" + suffix,
        work / f"spark-ckpt{suffix}",
        args.interval,
    )
    running.append(q)
    spark_lat = measure_latency(
        "spark", bootstrap, "src-spark" + suffix, "sink-spark" + suffix, args, 60.0 + 4 * args.interval
    )
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
    n: int,
    label: str,
    sides: tuple[str, str],
) -> dict[str, float]:
    """Phase 3, pass ``n`` (warm-up passes first, then the measured rounds): ``args.backlog``
    more records on each side's source, then each side in the order ``sides`` carries them;
    records/s per side.

    Every pass uses the same topics, the same eo pipeline (its ledger carries on where the
    last pass ended) and the same Spark checkpoint folder: each pass is a restart of one
    long-running job on a new backlog, the steady state streaming mode is for. (With a new
    pipeline per pass, eo's Spark plan changed with the topic names, and every pass paid a
    fresh code generation and its JIT compilation, which a running stream never does.)

    The warm-up passes matter because one JVM runs both sides and keeps compiling long
    after the first job: read off JMX (500k-record checkpoints, local[2]), HotSpot's
    compilers spent 2.0-2.8 CPU-s inside each of the first four prepares (as much as the
    task threads) and the prepare took 11.3 s, 3.5, 3.4, 2.6, 2.1, then 2.0-2.4 s from the
    fifth on; a single warm-up pass billed the measured rounds with that compilation.
    """
    from e2e import settle  # bench/ is the script's folder

    from airflow_provider_eo.kafka import admin

    log(f"{label}: producing a backlog of {args.backlog:,} records twice")
    for side in ("eo", "spark"):
        produce_backlog(bootstrap, f"bl-{side}", args.backlog, args.partitions)
    admin.ensure_topic({"bootstrap.servers": bootstrap}, f"bl-spark-sink-{n}", partitions=args.partitions)
    rates: dict[str, float] = {}
    for side in sides:
        settle_t0 = time.monotonic()
        settle()
        log(f"  before {side}: settled in {time.monotonic() - settle_t0:.1f}s, {jvm_state(spark)}")
        start = pass_counters(spark)
        if side == "eo":
            log(f"(a) {label}: eo stream over the backlog")
            eo = EoStream(backlog_pipeline(base), ledger, spark, args.interval)
            running.append(eo)
            eo.start()
            while eo.records < args.backlog and eo.thread.is_alive():
                time.sleep(0.05)
            seconds, cpu, jit, gc = pass_took(spark, start)
            eo.end()
            running.remove(eo)
            detail = f"; {eo.phases()}"
            records = eo.records
        else:
            log(f"(b) {label}: Spark over the backlog")
            # The sink is new per pass (Spark allows another sink topic on restart): its
            # high watermark counts exactly what this pass wrote.
            sink = f"bl-spark-sink-{n}"
            q = spark_query(spark, bootstrap, "bl-spark", sink, work / "spark-bl-ckpt", args.interval)
            running.append(q)
            last_log = start[0]
            while (hw := high_watermarks(bootstrap, sink, args.partitions)) < args.backlog:
                if time.monotonic() - last_log > 5:
                    last_log = time.monotonic()
                    log(f"  spark: {hw:,} records written")
                time.sleep(0.05)
            seconds, cpu, jit, gc = pass_took(spark, start)
            stop_when_idle(q)
            running.remove(q)
            written = high_watermarks(bootstrap, sink, args.partitions)
            detail = "" if written == args.backlog else f"; WROTE {written:,} (a batch ran twice)"
            records = args.backlog
        log(
            f"  {side}: {records:,} records in {seconds:.2f}s, machine CPU {cpu:.2f}s "
            f"({cpu / max(1, records) * 1e6:.1f} us/record), JIT {jit:.1f}s, GC {gc:.2f}s{detail}"
        )
        rates[side] = records / seconds
    return rates


def stop_when_idle(q: Any, timeout_s: float = 60.0) -> None:
    """Stop Spark's query once its batch is committed. Stopped while the batch's tasks
    commit (their records are already readable), a query re-runs that whole batch on
    restart, at-least-once: the next pass would count the repeat as its own work."""
    deadline = time.monotonic() + timeout_s
    while q.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    q.stop()


def backlog_pipeline(base: Pipeline) -> Pipeline:
    """eo's pipeline of phase 3 (every pass, warm-up or measured)."""
    return replace(base, name="bench-stream-backlog", source_topics=["bl-eo"], sink_topic="bl-eo-sink")


def parse_cases(args: argparse.Namespace) -> list[tuple[float, int | None]]:
    """``--cases "5:0,1:0,5:125000"`` as (interval, max_records or None for the backlog);
    without it, the one case of ``--interval`` and ``--max-records``."""
    if not args.cases:
        return [(args.interval, args.max_records)]
    out = []
    for item in args.cases.split(","):
        interval, _, cap = item.partition(":")
        out.append((float(interval), int(cap or 0) or None))
    return out


@dataclass
class CaseResult:
    """One interval/size case: latencies (None when skipped) and throughput medians."""

    interval: float
    max_records: int | None
    eo_lat: Latency | None
    spark_lat: Latency | None
    eo_rps: float
    spark_rps: float

    def case_line(self) -> str:
        """The case's machine-readable line."""

        def p50(lt: Latency | None) -> str:
            return "-" if lt is None else f"{lt.p50_s:.2f}"

        return (
            f"stream_case: interval_s={self.interval:g} max_records={self.max_records or 0} "
            f"eo_p50_s={p50(self.eo_lat)} spark_p50_s={p50(self.spark_lat)} "
            f"eo_rps={self.eo_rps:.0f} spark_rps={self.spark_rps:.0f}"
        )


def run_case(
    spark: Any,
    ledger: Any,
    base: Pipeline,
    bootstrap: str,
    work: Path,
    args: argparse.Namespace,
    running: list[Any],
    case_no: int,
) -> CaseResult:
    """The latency phases at the case's interval, then ``--rounds`` max-throughput rounds
    with its checkpoint cap (pass numbers continue after the warm-up and earlier cases)."""
    eo_lat = spark_lat = None
    if not args.skip_latency:
        suffix = f"-case{case_no + 1}" if case_no else ""
        eo_lat, spark_lat = latency_phases(spark, ledger, base, bootstrap, work, args, running, suffix)
    eo_rounds: list[float] = []
    spark_rounds: list[float] = []
    for i in range(1, args.rounds + 1):
        # Alternate which side goes first, so neither is billed for the other's leftovers.
        sides = ("eo", "spark") if i % 2 else ("spark", "eo")
        n = args.warm_passes + case_no * args.rounds + i
        rates = throughput_round(
            spark,
            ledger,
            base,
            bootstrap,
            work,
            args,
            running,
            n,
            f"max throughput, round {i}/{args.rounds}",
            sides,
        )
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
    return CaseResult(args.interval, args.max_records, eo_lat, spark_lat, eo_rps, spark_rps)


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
        "--warm-passes",
        type=int,
        default=5,
        help="unmeasured passes of --backlog records through each side (the max-throughput "
        "phase's topics, pipeline and Spark checkpoint) before anything is measured",
    )
    ap.add_argument(
        "--warm-small-seconds",
        type=float,
        default=20.0,
        help="unmeasured seconds of small checkpoints (each side at a 1 s interval, --rate "
        "records/s) before the warm-up passes; 0: none",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="max-throughput rounds (each side once per round, the first side alternating); "
        "the medians are reported",
    )
    ap.add_argument(
        "--spark-fetch-max-wait-ms",
        type=int,
        default=None,
        help="kafka.fetch.max.wait.ms of Spark's query (default: Spark's, 500); eo's bounded "
        "reads use 20 (spark/source.py FETCH_MAX_WAIT_MS), this gives Spark the same",
    )
    ap.add_argument(
        "--spark-max-offsets",
        type=int,
        default=None,
        help="maxOffsetsPerTrigger of Spark's query (default: none, one batch per backlog); "
        "the same as --max-records caps Spark's batches as eo's checkpoints are capped",
    )
    ap.add_argument(
        "--driver-read-max-records",
        type=int,
        default=None,
        help="eo: the largest checkpoint (offsets) the driver reads itself (default: "
        "spark/source.py's DRIVER_READ_MAX_RECORDS; 0: Spark's Kafka source reads every one)",
    )
    ap.add_argument(
        "--spark-commit-min-records",
        type=int,
        default=None,
        help="eo: spark_commit_min_records (default: the pipeline's, 1,000,000); a checkpoint "
        "below it is staged by the driver, 0: every checkpoint staged by the executors",
    )
    ap.add_argument("--skip-latency", action="store_true", help="only the max-throughput phase")
    ap.add_argument(
        "--cases",
        default=None,
        help='interval:max_records cases run one after the other, e.g. "5:0,1:0,5:125000" '
        "(0: the backlog); each prints a stream_case line, the first also the stream line "
        "(default: the one case of --interval and --max-records)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still runs
    if args.spark_fetch_max_wait_ms is not None:
        SPARK_SOURCE_OPTIONS["kafka.fetch.max.wait.ms"] = str(args.spark_fetch_max_wait_ms)
    if args.spark_max_offsets is not None:
        SPARK_SOURCE_OPTIONS["maxOffsetsPerTrigger"] = str(args.spark_max_offsets)

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.spark import source as spark_source
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    if args.driver_read_max_records is not None:
        spark_source.DRIVER_READ_MAX_RECORDS = args.driver_read_max_records

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
            for t in (f"src-{side}", f"sink-{side}", f"bl-{side}"):
                admin.ensure_topic(conf, t, partitions=args.partitions)
        admin.ensure_topic(conf, "bl-eo-sink", partitions=args.partitions)
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
        if args.spark_commit_min_records is not None:
            base = replace(base, spark_commit_min_records=args.spark_commit_min_records)

        # One pass of phase 3: (pass number, label, order of the sides) -> records/s per side.
        phase3 = functools.partial(throughput_round, spark, ledger, base, bootstrap, work, args, running)
        # Warm-up, unmeasured: small checkpoints first, then phase 3's passes. The first
        # small checkpoints in a JVM load and compile code of their own (eo's driver-side
        # read and staging), and the large checkpoint's compiled code is then compiled
        # again: without them here, that recompilation falls in the first case's measured
        # rounds (eo's 500k-record checkpoint 4.1 s against 2.7 s, JIT 1.1 s against 0.3 s
        # in the next case's), and on eo most, whose pass goes first.
        if args.warm_small_seconds > 0:
            log(f"warm-up: {args.warm_small_seconds:g}s of small checkpoints per side, interval 1s")
            small = argparse.Namespace(
                **{**vars(args), "interval": 1.0, "warmup": 0.0, "seconds": args.warm_small_seconds}
            )
            latency_phases(spark, ledger, base, bootstrap, work, small, running, "-warm")
        for k in range(1, args.warm_passes + 1):
            phase3(k, f"warm-up pass {k}/{args.warm_passes}", ("eo", "spark"))
        results = []
        for case_no, (interval, max_records) in enumerate(parse_cases(args)):
            case = argparse.Namespace(**{**vars(args), "interval": interval, "max_records": max_records})
            case_base = replace(base, max_records_per_checkpoint=max_records or max(args.backlog, 100_000))
            log(f"case {case_no + 1}: interval {interval:g}s, max_records {max_records or 'the backlog'}")
            result = run_case(spark, ledger, case_base, bootstrap, work, case, running, case_no)
            results.append(result)
            print(result.case_line(), flush=True)
        eo_lat, spark_lat, eo_rps, spark_rps = (
            results[0].eo_lat,
            results[0].spark_lat,
            results[0].eo_rps,
            results[0].spark_rps,
        )
        args.interval = results[0].interval
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
