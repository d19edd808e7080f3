"""Structured Streaming sink benchmark: one stateful query (running count per key, ``update``
mode) through Spark's own Kafka sink (at-least-once) and through ``KafkaExactlyOnceSink``,
same machine, same SparkSession, one run.

    .venv/bin/python bench/ss_sink.py [--backlog 400000] [--batch 100000] [--rounds 3]
                                      [--interval 5] [--rate 1000] [--seconds 40] [--partitions 4]

1. Throughput, ``--rounds`` rounds (first side alternating, medians reported): ``--backlog``
   records are written to the source, then each side's query (its own checkpoint location,
   ``availableNow``, ``maxOffsetsPerTrigger`` = ``--batch``) carries them; records / seconds
   from the query's start to its end (eo: every batch committed; Spark: every batch written).
   One unmeasured round first warms the JVM.
2. Latency: each side's query runs with ``trigger(processingTime=--interval)`` while a
   producer writes ``--rate`` records/s for ``--seconds``; every output row carries the
   newest source timestamp of its key in the batch, and a ``read_committed`` consumer of the
   sink notes when the row arrives. Latency = arrival - that timestamp; p50 over the rows.

``--phases`` also prints where a throughput batch's time goes, medians over the measured
rounds' batches: for each side Spark's own progress figures (``addBatch``: the batch's work,
the sink's part of it; ``triggerExecution``: the whole trigger), and for eo the parts of its
``addBatch`` timed in this process (reading the query's offset log, building the batch's
runtime, the plan, the Spark job that computes and collects the batch, writing the staged
file, the rest of the prepare, the commit). One ``ss_sink_phases:`` line per side.

Progress goes to stderr; the last line on stdout is
``ss_sink: batches= records= eo_rps= spark_rps= eo_p50_s= spark_p50_s=``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = 1000


def log(msg: str) -> None:
    print(f"[ss_sink {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def produce(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for seq in range(start, start + n):
        while True:
            try:
                p.produce(topic, key=str(seq % KEYS).encode(), value=b"x" * 100, partition=seq % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if seq % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def produce_at_rate(bootstrap: str, topic: str, rate: float, seconds: float, partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    started = time.monotonic()
    seq = 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while seq < due:
            p.produce(
                topic,
                key=str(seq % KEYS).encode(),
                value=b"x" * 100,
                partition=seq % partitions,
                timestamp=int(time.time() * 1000),
            )
            seq += 1
        p.poll(0)
        time.sleep(0.005)
    p.flush(60)


class Phases:
    """Seconds spent per micro-batch in named parts of the eo sink's ``foreach_batch``, timed
    by wrapping the functions it calls (this process is the query's driver)."""

    #: (module, attribute, phase): the functions timed, outermost first.
    TIMED = (
        ("airflow_provider_eo.streaming.sink", "KafkaExactlyOnceSink._batch", "batch"),
        ("airflow_provider_eo.spark.offset_log", "query_id", "offset_log"),
        ("airflow_provider_eo.spark.offset_log", "batch_offsets", "offset_log"),
        ("airflow_provider_eo.streaming.sink", "build_runtime", "runtime"),
        ("airflow_provider_eo.core.coordinator", "Coordinator.plan", "plan"),
        ("airflow_provider_eo.core.coordinator", "Coordinator.prepare", "prepare"),
        ("airflow_provider_eo.spark.driver_stage", "collect_staged", "prepare_job"),
        ("airflow_provider_eo.spark.driver_stage", "write_staged", "prepare_write"),
        ("airflow_provider_eo.spark.write", "write_staged", "prepare_job"),
        ("airflow_provider_eo.core.coordinator", "Coordinator.commit", "commit"),
    )

    def __init__(self) -> None:
        self.batches: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import functools
        import importlib

        for module_name, attr, phase in self.TIMED:
            owner: Any = importlib.import_module(module_name)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

            def timed(*a: Any, _f: Any = original, _phase: str = phase, **kw: Any) -> Any:
                started = time.perf_counter()
                if _phase == "batch":
                    self._current = {}
                try:
                    return _f(*a, **kw)
                finally:
                    spent = time.perf_counter() - started
                    if self._current is not None:
                        self._current[_phase] = self._current.get(_phase, 0.0) + spent
                    if _phase == "batch" and self._current is not None:
                        self.batches.append(self._current)
                        self._current = None

            setattr(owner, name, functools.wraps(original)(timed))
            self._undo.append((owner, name, original))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def summary(self) -> dict[str, float]:
        """Median seconds per batch of each phase, and what the timed parts leave."""
        out: dict[str, float] = {}
        for _module, _attr, phase in self.TIMED:
            values = [b.get(phase, 0.0) for b in self.batches]
            if values:
                out[phase] = statistics.median(values)
        rest = [
            b.get("prepare", 0.0) - b.get("prepare_job", 0.0) - b.get("prepare_write", 0.0)
            for b in self.batches
        ]
        untimed = [
            b["batch"] - sum(b.get(k, 0.0) for k in ("offset_log", "runtime", "plan", "prepare", "commit"))
            for b in self.batches
        ]
        if self.batches:
            out["prepare_rest"] = statistics.median(rest)
            out["batch_rest"] = statistics.median(untimed)
        return out


def spark_progress(q: Any) -> list[dict[str, float]]:
    """Each batch's ``durationMs`` figures (seconds) from the query's progress reports."""
    out = []
    for progress in q.recentProgress:
        durations = progress.durationMs if hasattr(progress, "durationMs") else progress["durationMs"]
        out.append({k: v / 1000 for k, v in dict(durations).items()})
    return out


class Arrivals(threading.Thread):
    """Latencies of the sink's rows (arrival - the newest source timestamp they carry)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([topic])
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(1000, 0.2):
                if msg.error():
                    continue
                now = time.time()
                ts_ms = int(msg.value().decode().rsplit("@", 1)[1])
                self.latencies.append(now - ts_ms / 1000)
        self.consumer.close()


def query(spark: Any, bootstrap: str, source: str, batch: int | None) -> Any:
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
    )
    if batch:
        reader = reader.option("maxOffsetsPerTrigger", batch)
    counts = reader.load().groupBy("key").agg(F.count("*").alias("n"), F.max("timestamp").alias("ts"))
    value = F.concat(
        F.col("key").cast("string"),
        F.lit("="),
        F.col("n").cast("string"),
        F.lit("@"),
        (F.unix_millis(F.col("ts"))).cast("string"),
    )
    return counts.select("key", value.alias("value"))


def start(
    side: str,
    frame: Any,
    bootstrap: str,
    sink: str,
    work: Path,
    name: str,
    *,
    available_now: bool,
    interval: float,
) -> Any:
    """Start ``frame`` writing to ``sink`` through ``side``'s sink; returns the StreamingQuery."""
    checkpoint = str(work / f"ckpt-{name}")
    if side == "eo":
        from airflow_provider_eo.streaming import KafkaExactlyOnceSink

        eo = KafkaExactlyOnceSink(
            name=name,
            kafka={"bootstrap.servers": bootstrap},
            sink_topic=sink,
            ledger_url=f"sqlite:///{work / 'ledger.db'}",
            staging_dir=str(work / "staging"),
            commit_mode="local",
        )
        return eo.start(
            frame,
            checkpoint,
            output_mode="update",
            available_now=available_now,
            trigger_interval=f"{interval:g} seconds",
        )
    writer = (
        frame.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{interval:g} seconds")
    )
    return writer.start()


def throughput(
    spark: Any,
    bootstrap: str,
    work: Path,
    side: str,
    args: argparse.Namespace,
    tag: str,
    progress: list[dict[str, float]] | None = None,
) -> tuple[float, int]:
    """records/s of one side carrying a fresh backlog, and its batches (each batch's
    progress figures appended to ``progress``)."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    cfg = {"bootstrap.servers": bootstrap}
    source, sink = f"ss-src-{tag}", f"ss-out-{tag}"
    ensure_topic(cfg, source, partitions=args.partitions)
    ensure_topic(cfg, sink, partitions=args.partitions)
    produce(bootstrap, source, args.backlog, args.partitions)
    started = time.monotonic()
    q = start(
        side,
        query(spark, bootstrap, source, args.batch),
        bootstrap,
        sink,
        work,
        f"tp-{tag}",
        available_now=True,
        interval=args.interval,
    )
    q.awaitTermination()
    seconds = time.monotonic() - started
    batches = len(q.recentProgress)
    if progress is not None:
        progress.extend(spark_progress(q))
    return args.backlog / seconds, batches


def latency(spark: Any, bootstrap: str, work: Path, side: str, args: argparse.Namespace) -> float:
    from airflow_provider_eo.kafka.admin import ensure_topic

    cfg = {"bootstrap.servers": bootstrap}
    tag = f"lat-{side}"
    source, sink = f"ss-src-{tag}", f"ss-out-{tag}"
    ensure_topic(cfg, source, partitions=args.partitions)
    ensure_topic(cfg, sink, partitions=args.partitions)
    arrivals = Arrivals(bootstrap, sink)
    arrivals.start()
    q = start(
        side,
        query(spark, bootstrap, source, None),
        bootstrap,
        sink,
        work,
        tag,
        available_now=False,
        interval=args.interval,
    )
    try:
        produce_at_rate(bootstrap, source, args.rate, args.seconds, args.partitions)
        time.sleep(2 * args.interval)  # the last batches
    finally:
        q.stop()
        arrivals.stop.set()
        arrivals.join(10)
    if not arrivals.latencies:
        raise SystemExit(f"{side}: no output row arrived")
    return statistics.median(arrivals.latencies)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=100_000, help="maxOffsetsPerTrigger in the throughput phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--phases", action="store_true", help="print where a throughput batch's time goes")
    ap.add_argument("--no-latency", action="store_true", help="skip the latency phase")
    args = ap.parse_args()

    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"ss-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    spark = None
    try:
        bootstrap = kafka.up(timeout_s=120).bootstrap
        spark = get_spark("eo-bench-ss", conf={"spark.sql.shuffle.partitions": str(args.partitions)})
        spark.sparkContext.setLogLevel("ERROR")
        log("warm-up round")
        for side in ("spark", "eo"):
            throughput(spark, bootstrap, work, side, args, f"warm-{side}")
        rps: dict[str, list[float]] = {"eo": [], "spark": []}
        progress: dict[str, list[dict[str, float]]] = {"eo": [], "spark": []}
        phases = Phases()
        if args.phases:
            phases.install()
        batches = 0
        for r in range(args.rounds):
            for side in ("eo", "spark") if r % 2 == 0 else ("spark", "eo"):
                value, batches = throughput(spark, bootstrap, work, side, args, f"{r}-{side}", progress[side])
                rps[side].append(value)
                log(f"round {r + 1}: {side} {value:,.0f} records/s ({batches} batches)")
        phases.uninstall()
        if args.phases:
            for side in ("spark", "eo"):
                figures = {
                    k: statistics.median(b.get(k, 0.0) for b in progress[side])
                    for k in (
                        "triggerExecution",
                        "addBatch",
                        "latestOffset",
                        "queryPlanning",
                        "walCommit",
                        "commitOffsets",
                    )
                }
                if side == "eo":
                    figures.update(phases.summary())
                print(
                    f"ss_sink_phases: side={side} batches={len(progress[side])} "
                    + " ".join(f"{k}_s={v:.3f}" for k, v in figures.items()),
                    flush=True,
                )
        p50 = {"eo": float("nan"), "spark": float("nan")}
        for side in () if args.no_latency else ("spark", "eo"):
            p50[side] = latency(spark, bootstrap, work, side, args)
            log(f"latency {side}: p50 {p50[side]:.2f}s at a {args.interval:g}s interval")
        eo_rps, spark_rps = statistics.median(rps["eo"]), statistics.median(rps["spark"])
        log(f"throughput: eo {eo_rps:,.0f} vs spark {spark_rps:,.0f} records/s ({eo_rps / spark_rps:.2f}x)")
        print(
            f"ss_sink: batches={batches} records={args.backlog} eo_rps={eo_rps:.0f} "
            f"spark_rps={spark_rps:.0f} eo_p50_s={p50['eo']:.2f} spark_p50_s={p50['spark']:.2f}"
        )
        return 0
    finally:
        from airflow_provider_eo.kafka.producer_pool import close_producers

        if spark is not None:
            spark.stop()
        close_producers()  # the sink's kept producers, before their broker goes
        kafka.wipe()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
