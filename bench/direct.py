"""Direct-publish evaluation: how much streaming latency the staging round trip costs.

    .venv/bin/python bench/direct.py [--interval 5] [--rate 1000] [--seconds 40] [--warmup 10]
                                     [--rounds 3] [--partitions 4]

eo's streaming mode stages every checkpoint's output (Parquet) and publishes it afterwards in
Kafka transactions (prepare, then commit). The alternative is a *direct* mode (Flink's
per-subtask writer): each Spark task publishes its own output in its own transaction, on a
transactional id frozen per source partition, with its source range's consumer-group offsets
and a commit marker in the same transaction; no staging, one Spark job per checkpoint. This
benchmark measures that path's latency against the staged stream and Spark's own sink, same
machine, same interval, same input rate, to decide whether the direct mode is worth building
(docs/design.md §8, "Why the stream stages its output").

After an unmeasured round (``--warm-seconds``), per round (``--rounds``, medians reported),
each phase on topics of its own, one after the other:

1. ``direct``: a loop in this process; every ``--interval`` seconds it reads the source's high
   watermarks, builds the checkpoint's DataFrame exactly as a prepare does (bounded read of
   the ranges, provenance column, the transform ``upper``, the staged columns) and runs one
   ``mapInArrow`` job whose tasks each publish their range's output in one transaction
   (producers kept per Python worker and transactional id; a fenced one is replaced). This is
   the path's *floor*: it has no ledger writes (a direct mode would need about three per
   checkpoint: the plan, the tasks' rows, COMMITTED; 15-25 ms with SQLite) and reads no marker
   before publishing (only a retried task must).
2. ``staged``: ``run_stream`` (inline commit), as bench/stream.py runs it.
3. ``spark``: Spark Structured Streaming's own (at-least-once) Kafka sink.

Latency = the time a record became readable by a ``read_committed`` consumer of the sink minus
its source timestamp (bench/stream.py's ``measure_latency``); each phase also checks that
every record arrived once. Prints per round and, last, the medians:

    direct_eval: interval_s= rounds= direct_p50_s= staged_p50_s= spark_p50_s=
                 direct_build_s= direct_job_s= staged_prepare_s= staged_commit_s=
                 direct_refenced_per_checkpoint=

(``direct_build_s``: the driver's DataFrame building per checkpoint, ``direct_job_s``: the
publishing job, medians over the checkpoints; ``staged_*``: the stream's prepare and commit;
``direct_refenced_per_checkpoint``: tasks per checkpoint whose range's producer, kept by
another Python worker, had been fenced since, so a new one had to ``init_transactions``.)
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stream import (  # noqa: E402  (bench/stream.py)
    TRANSFORM,
    EoStream,
    InThread,
    Latency,
    log,
    measure_latency,
    spark_query,
)

from airflow_provider_eo.pipeline import Pipeline  # noqa: E402

#: The result row of one publishing task.
RESULT_DDL = "topic string, partition int, records long, publish_s double, pid int, rounds int"


@dataclass(frozen=True)
class DirectSpec:
    """What every task of one checkpoint needs (picklable, no live client)."""

    pipeline: str
    identity: str
    checkpoint_id: int
    sink_topic: str
    kafka: tuple[tuple[str, Any], ...]
    marker_group: str
    group_id: str
    ranges: tuple[tuple[str, int, int, int], ...]  # (topic, partition, start, end)
    transaction_timeout_ms: int = 60_000

    def transactional_id(self, topic: str, partition: int) -> str:
        """Frozen per source partition: a retried or zombie task of the same range is fenced."""
        return f"eo-direct.{self.pipeline}.{topic}.{partition}"


def _producers() -> dict[str, Any]:
    """This Python worker's producers by transactional id. Kept on ``sys`` because the task's
    function is pickled by value (it lives in a script), and its module globals with it."""
    cache: dict[str, Any] | None = getattr(sys, "_eo_direct_producers", None)
    if cache is None:
        cache = {}
        sys._eo_direct_producers = cache  # type: ignore[attr-defined]
    return cache


def publish_task(spec: DirectSpec) -> Any:
    """The ``mapInArrow`` function: buffer the task's rows, then publish them, its marker and
    its range's group offset in one transaction on the range's transactional id."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import os

        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_provider_eo import names
        from airflow_provider_eo.kafka.publisher import (
            DeliveryFailures,
            connect,
            group_metadata,
            new_producer,
            offsets,
            produce_staged,
        )

        rows = [b for b in batches if b.num_rows]
        if not rows:  # nothing read or all filtered: the driver seals this range
            return
        table = pa.Table.from_batches(rows)
        topics = pc.unique(table.column("src_topic")).to_pylist()
        parts = pc.unique(table.column("src_partition")).to_pylist()
        if len(topics) != 1 or len(parts) != 1 or topics[0] is None:
            raise RuntimeError(f"a direct task must hold exactly one source range, got {topics} {parts}")
        topic, part = str(topics[0]), int(parts[0])
        end = next(e for t, p, _s, e in spec.ranges if (t, p) == (topic, part))
        config = dict(spec.kafka)
        timeout_s = spec.transaction_timeout_ms / 1000
        tid = spec.transactional_id(topic, part)
        header = names.provenance_checkpoint_field(spec.pipeline, spec.checkpoint_id, spec.identity).encode()
        sink_col = table.column("sink_partition")
        by_sink = [
            (int(s), table.filter(pc.equal(sink_col, s))) for s in sorted(pc.unique(sink_col).to_pylist())
        ]
        cache = _producers()
        for round_ in (1, 2):
            producer = cache.pop(tid, None)
            if producer is None:
                producer = new_producer(config, tid, spec.transaction_timeout_ms, DeliveryFailures())
                connect(producer, spec.sink_topic, timeout_s)
                producer.init_transactions(timeout_s)
            started = time.monotonic()
            committing = False
            try:
                producer.begin_transaction()
                produced = 0
                for sink_partition, sub in by_sink:
                    produced += produce_staged(
                        producer, spec.sink_topic, sink_partition, sub.to_batches(), header
                    )
                producer.flush(timeout_s)
                producer.send_offsets_to_transaction(
                    offsets({(topic, part): spec.checkpoint_id}, names.marker_metadata(spec.identity)),
                    group_metadata(config, spec.marker_group),
                    timeout_s,
                )
                producer.send_offsets_to_transaction(
                    offsets({(topic, part): end}), group_metadata(config, spec.group_id), timeout_s
                )
                committing = True
                producer.commit_transaction(timeout_s)
            except Exception:
                # Fenced by this range's producer in another Python worker (a task of the
                # range ran there before): a new producer re-inits and the round is redone.
                # After commit_transaction the outcome would be unknown: a product would read
                # the marker; the benchmark stops.
                if committing or round_ == 2:
                    raise
                continue
            cache[tid] = producer  # reused only after a clean commit
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "topic": topic,
                        "partition": part,
                        "records": produced,
                        "publish_s": time.monotonic() - started,
                        "pid": os.getpid(),
                        "rounds": round_,
                    }
                ],
                schema=pa.schema(
                    [
                        ("topic", pa.string()),
                        ("partition", pa.int32()),
                        ("records", pa.int64()),
                        ("publish_s", pa.float64()),
                        ("pid", pa.int32()),
                        ("rounds", pa.int32()),
                    ]
                ),
            )
            return

    return run


@dataclass
class DirectCheckpoint:
    checkpoint_id: int
    records: int
    build_s: float
    job_s: float
    refenced: int  # tasks whose kept producer had been fenced by another worker's


class DirectStream(InThread):
    """The direct path in a thread: plan from the high watermarks, build, one publishing job."""

    def __init__(self, spark: Any, pipeline: Pipeline, interval_s: float, partitions: int) -> None:
        super().__init__("eo-direct")
        self.spark, self.pipeline, self.interval_s, self.partitions = spark, pipeline, interval_s, partitions
        self.identity = uuid.uuid4().hex
        self.checkpoints: list[DirectCheckpoint] = []

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from airflow_provider_eo import names
        from airflow_provider_eo.kafka.client_config import librdkafka_config
        from airflow_provider_eo.ledger.records import RangeSpec
        from airflow_provider_eo.spark import shape, source
        from airflow_provider_eo.spark.transform import apply_transform, load_transform

        p = self.pipeline
        config = librdkafka_config(p.kafka)
        (topic,) = p.source_topics
        watermarks = Consumer({**config, "group.id": f"direct-plan-{uuid.uuid4().hex[:8]}"})
        transform = load_transform(p.transform)
        ends = {part: 0 for part in range(self.partitions)}
        cid = 0
        next_tick = time.monotonic()
        try:
            while not self.stop.wait(max(0.0, next_tick - time.monotonic())):
                next_tick = time.monotonic() + self.interval_s
                highs = {
                    part: watermarks.get_watermark_offsets(TopicPartition(topic, part), timeout=10)[1]
                    for part in ends
                }
                ranges = [
                    RangeSpec(topic, part, ends[part], highs[part])
                    for part in ends
                    if highs[part] > ends[part]
                ]
                if not ranges:
                    continue
                cid += 1
                spec = DirectSpec(
                    pipeline=p.name,
                    identity=self.identity,
                    checkpoint_id=cid,
                    sink_topic=p.sink_topic,
                    kafka=tuple(sorted(config.items())),
                    marker_group=names.marker_group(p),
                    group_id=p.group_id,
                    ranges=tuple((r.topic, r.partition, r.start, r.end) for r in ranges),
                )
                t0 = time.monotonic()
                frame = source.with_provenance(source.read_ranges(self.spark, p, ranges))
                out = apply_transform(transform, frame, ref=p.transform, where=f"direct {cid}")
                staged = shape.staged_frame(out, self.partitions, f"direct {cid}", frame)
                job = staged.mapInArrow(publish_task(spec), RESULT_DDL)
                t1 = time.monotonic()
                results = job.collect()
                t2 = time.monotonic()
                done = {(r.topic, r.partition) for r in results}
                unsealed = [r for r in ranges if (r.topic, r.partition) not in done]
                if unsealed:  # ranges whose tasks had no output: none in this benchmark
                    raise RuntimeError(f"checkpoint {cid}: ranges without output {unsealed}")
                for r in ranges:
                    ends[r.partition] = r.end
                self.checkpoints.append(
                    DirectCheckpoint(
                        cid,
                        sum(r.records for r in results),
                        t1 - t0,
                        t2 - t1,
                        sum(r.rounds - 1 for r in results),
                    )
                )
                log(
                    f"    direct checkpoint {cid}: {sum(r.records for r in results):,} records, build "
                    f"{t1 - t0:.2f}s, job {t2 - t1:.2f}s (tasks' transactions "
                    f"{', '.join(f'{r.publish_s:.2f}' for r in results)}s)"
                )
        finally:
            watermarks.close()


@dataclass
class Round:
    direct: Latency
    staged: Latency
    spark: Latency
    direct_build_s: float
    direct_job_s: float
    staged_prepare_s: float
    staged_commit_s: float
    refenced: float  # tasks per checkpoint that had to re-init a fenced producer (mean)


def check(name: str, lat: Latency) -> None:
    if lat.missing or lat.duplicates:
        raise SystemExit(f"{name}: {lat.missing} records missing, {lat.duplicates} duplicates")


def one_round(
    spark: Any, ledger: Any, base: Pipeline, bootstrap: str, work: Path, args: argparse.Namespace, k: int
) -> Round:
    from airflow_provider_eo.kafka import admin

    conf = {"bootstrap.servers": bootstrap}
    names = {side: (f"src-{side}-{k}", f"sink-{side}-{k}") for side in ("direct", "staged", "spark")}
    for src, sink in names.values():
        admin.ensure_topic(conf, src, partitions=args.partitions)
        admin.ensure_topic(conf, sink, partitions=args.partitions)
    drain = 60.0 + 4 * args.interval

    src, sink = names["direct"]
    direct_pipeline = replace(base, name=f"direct-{k}", source_topics=[src], sink_topic=sink)
    log(f"round {k}: (a) direct, interval {args.interval:g}s, {args.rate:g} records/s")
    direct = DirectStream(spark, direct_pipeline, args.interval, args.partitions)
    direct.start()
    try:
        direct_lat = measure_latency("direct", bootstrap, src, sink, args, drain)
    finally:
        direct.end()

    src, sink = names["staged"]
    log(f"round {k}: (b) staged stream, inline commit")
    eo = EoStream(
        replace(base, name=f"staged-{k}", source_topics=[src], sink_topic=sink), ledger, spark, args.interval
    )
    eo.start()
    try:
        staged_lat = measure_latency("staged", bootstrap, src, sink, args, drain)
    finally:
        eo.end()
    log(f"  staged phases: {eo.phases()}")

    src, sink = names["spark"]
    log(f"round {k}: (c) Spark's own sink")
    q = spark_query(spark, bootstrap, src, sink, work / f"spark-ckpt-{k}", args.interval)
    try:
        spark_lat = measure_latency("spark", bootstrap, src, sink, args, drain)
    finally:
        q.stop()
    for name, lat in (("direct", direct_lat), ("staged", staged_lat), ("spark", spark_lat)):
        check(name, lat)
        log(f"  {name}: p50 {lat.p50_s:.2f}s p99 {lat.p99_s:.2f}s over {lat.measured:,} records")
    cps = [c for c in direct.checkpoints if c.records]
    scps = [c for c in eo.checkpoints if c.records]
    return Round(
        direct_lat,
        staged_lat,
        spark_lat,
        statistics.median(c.build_s for c in cps),
        statistics.median(c.job_s for c in cps),
        statistics.median(c.prepare_s or 0.0 for c in scps),
        statistics.median(c.commit_s or 0.0 for c in scps),
        statistics.mean(c.refenced for c in cps),
    )


def line(interval: float, rounds: list[Round]) -> str:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}"

    return (
        f"direct_eval: interval_s={interval:g} rounds={len(rounds)} "
        f"direct_p50_s={med([r.direct.p50_s for r in rounds])} "
        f"staged_p50_s={med([r.staged.p50_s for r in rounds])} "
        f"spark_p50_s={med([r.spark.p50_s for r in rounds])} "
        f"direct_build_s={med([r.direct_build_s for r in rounds])} "
        f"direct_job_s={med([r.direct_job_s for r in rounds])} "
        f"staged_prepare_s={med([r.staged_prepare_s for r in rounds])} "
        f"staged_commit_s={med([r.staged_commit_s for r in rounds])} "
        f"direct_refenced_per_checkpoint={med([r.refenced for r in rounds])}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=5.0, help="trigger interval, seconds (all three)")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s into each source")
    ap.add_argument("--seconds", type=float, default=40.0, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds before those")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (medians)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--warm-seconds",
        type=float,
        default=20.0,
        help="an unmeasured round of this many seconds first (the JVM's JIT, Python workers, "
        "producers: the first checkpoints of a cold session take seconds)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still runs

    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"direct-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    spark = None
    ledger = None
    log("starting a broker")
    bootstrap = kafka.up().bootstrap
    try:
        log("starting Spark")
        spark = get_spark("eo-bench-direct", {"spark.ui.showConsoleProgress": "false"})
        ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
        base = Pipeline(
            name="bench-direct",
            kafka={"bootstrap.servers": bootstrap},
            source_topics=["unused-src"],
            sink_topic="unused-sink",
            transform=TRANSFORM,
            ledger_url=f"sqlite:///{work / 'ledger.db'}",
            staging_dir=str(work / "staging"),
        )
        if args.warm_seconds > 0:
            warm = argparse.Namespace(**{**vars(args), "seconds": args.warm_seconds, "warmup": 0.0})
            one_round(spark, ledger, base, bootstrap, work, warm, 0)
        rounds = []
        for k in range(1, args.rounds + 1):
            rounds.append(one_round(spark, ledger, base, bootstrap, work, args, k))
            print(
                line(args.interval, rounds[-1:]).replace("direct_eval:", f"direct_eval_round{k}:"), flush=True
            )
    finally:
        if ledger is not None:
            ledger.close()
        if spark is not None:
            spark.stop()
        kafka.wipe()
        shutil.rmtree(work, ignore_errors=True)
    print(line(args.interval, rounds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
