"""End-to-end throughput: this pipeline vs Spark's own at-least-once Kafka sink.

Usage: .venv/bin/python bench/e2e.py [--records N] [--partitions P]

Same records (~100-byte values), same machine, same run, same Spark session:
  (a) eo: plan -> prepare (Spark, in-process) -> commit (``eo commit`` subprocess, so its
      peak RSS is measured alone), one checkpoint (its ``transaction_timeout_ms`` raised so
      the plan may size it to N records; above 2,250,000 it is cut and every rate counts the
      records the ledger shows it read, ``records=`` on the last line);
  (b) Spark's at-least-once sink: the same bounded read and transform, then
      ``df.write.format("kafka")``;
  (c) the commit phase alone vs a plain non-transactional confluent-kafka producer sending
      the same staged records with the same produce loop and headers (a fresh process as
      well, timed from inside like the commit).
Each timed phase starts on a quiet machine (``settle``, untimed), so one phase's leftover
JVM garbage collection or broker flushing is not billed to the next.
The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_provider_eo import staging  # noqa: E402
from airflow_provider_eo.kafka import admin  # noqa: E402
from airflow_provider_eo.pipeline import Pipeline  # noqa: E402


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def produce_source(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    pad = "x" * 60
    for i in range(n):
        while True:
            try:
                p.produce(
                    topic,
                    key=f"user-{i % 9973}".encode(),
                    value=f'{{"seq":{i:09d},"pad":"{pad}"}}'.encode(),
                    partition=i % partitions,
                )
                break
            except BufferError:
                p.poll(0.05)
        if i % 200_000 == 0 and i:
            log(f"  produced {i:,}/{n:,}")
    p.flush(120)


def plain_send(pipeline: Pipeline, manifest: staging.Manifest, location: str, topic: str) -> float:
    """The commit's own produce loop (same code) without transactions: what an at-least-once
    producer of the same records costs."""
    from confluent_kafka import Producer

    from airflow_provider_eo.kafka.publisher import produce_staged

    producer = Producer(
        {
            "bootstrap.servers": pipeline.kafka["bootstrap.servers"],
            "linger.ms": 10,
            "enable.idempotence": True,
            "acks": "all",
            "queue.buffering.max.messages": 100_000,
            "queue.buffering.max.kbytes": 65_536,
        }
    )
    started = time.monotonic()
    ckpt = f"{pipeline.name}:{manifest.checkpoint_id}".encode()
    for partition, files in sorted(manifest.files.items()):
        produce_staged(producer, topic, partition, staging.iter_batches(location, files), ckpt)
    producer.flush(300)
    return time.monotonic() - started


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields), idle


def settle(max_s: float = 20.0, busy_below: float = 0.15) -> None:
    """Wait (untimed) until the machine is quiet: each timed phase starts alike, not while the
    JVMs still collect garbage or the broker flushes the previous phase's writes."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        total0, idle0 = _cpu_times()
        time.sleep(0.5)
        total1, idle1 = _cpu_times()
        if total1 > total0 and 1 - (idle1 - idle0) / (total1 - total0) < busy_below:
            return


def one_checkpoint_timeout_ms(records: int) -> int:
    """The ``transaction_timeout_ms`` that lets a new pipeline's first checkpoint plan
    ``records`` offsets: with no commit measured yet, plan sizes a checkpoint so its commit
    publishes within half of the timeout at ``DEFAULT_PUBLISH_RATE`` (core/plan.py), 150,000
    offsets at the default 60 s. At least 60 s, at most the broker's 15 min (2,250,000
    offsets): beyond that the benches report the records that ran, read from the ledger."""
    import math

    from airflow_provider_eo.core.plan import DEFAULT_PUBLISH_RATE, PUBLISH_TIMEOUT_SHARE
    from airflow_provider_eo.pipeline import BROKER_MAX_TRANSACTION_TIMEOUT_MS

    needed = math.ceil(records * 1000 / (DEFAULT_PUBLISH_RATE * PUBLISH_TIMEOUT_SHARE))
    return min(max(60_000, needed), BROKER_MAX_TRANSACTION_TIMEOUT_MS)


def watch_peak_rss_kb(child: subprocess.Popen[bytes]) -> int:
    """The child's own peak RSS (``VmHWM``), polled until it exits.

    Not ``ru_maxrss`` from ``wait4``: Linux seeds a child's maxrss at ``exec`` with the
    high-water mark of the memory it was forked (or vforked) from, i.e. this benchmark's
    own RSS, which grows with the record count. ``VmHWM`` belongs to the exec'd image only.
    """
    peak = 0
    status = Path(f"/proc/{child.pid}/status")
    while child.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass  # exited between poll() and the read
        time.sleep(0.01)
    return peak


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[str, int]:
    """Run one timed phase in a fresh process: (its stdout, its peak RSS in kB)."""
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL)
        peak_kb = watch_peak_rss_kb(child)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:3])} failed with exit {child.returncode}")
        out.seek(0)
        return out.read().decode(), peak_kb


def plain_send_child(location: str, topic: str) -> int:
    """``--plain-send``: (c) in its own process; the pipeline comes from the environment."""
    from bench_pipeline import from_env

    pipeline = from_env()
    manifest = staging.read_manifest(location)
    print(json.dumps({"seconds": plain_send(pipeline, manifest, location, topic)}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--plain-send", metavar="STAGING", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_send:
        return plain_send_child(args.plain_send, args.topic)
    # A terminated benchmark still stops its broker (the finally below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n, parts = args.records, args.partitions

    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.spark.stager import SparkStager
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    log("starting a broker for the benchmark")
    bootstrap = kafka.up().bootstrap
    try:
        conf = {"bootstrap.servers": bootstrap}
        for t in ("src", "sink-eo", "sink-alos", "sink-plain"):
            admin.ensure_topic(conf, t, partitions=parts)
        log(f"producing {n:,} source records into {parts} partitions")
        produce_source(bootstrap, "src", n, parts)
        pipeline = Pipeline(
            name="bench",
            kafka=conf,
            source_topics=["src"],
            sink_topic="sink-eo",
            transform="airflow_provider_eo.examples.transforms:upper",
            ledger_url=f"sqlite:///{work / 'ledger.db'}",
            staging_dir=str(work / "staging"),
            max_records_per_checkpoint=n,
            # One checkpoint of n records although nothing is measured yet (see the helper).
            transaction_timeout_ms=one_checkpoint_timeout_ms(n),
            keep_committed_staging=1,
        )
        spark = get_spark("eo-bench")
        ledger = Ledger(pipeline.ledger_url)
        from airflow_provider_eo.examples.transforms import upper
        from airflow_provider_eo.spark.source import kafka_source as _kafka_source

        log("warming up: a 10k-record checkpoint through both paths (JIT, Spark, and the broker's")
        log("  transaction/offsets topics, which a long-running cluster already has)")
        admin.ensure_topic(conf, "warm-src", partitions=parts)
        admin.ensure_topic(conf, "warm-sink", partitions=parts)
        produce_source(bootstrap, "warm-src", 10_000, parts)
        warm = replace(pipeline, name="warm", source_topics=["warm-src"], sink_topic="warm-sink")
        from airflow_provider_eo.core.runner import run_once

        run_once(warm, ledger=ledger, stager=SparkStager(spark))
        warm_ranges = ledger.last_committed("warm").ranges
        (
            upper(_kafka_source(spark, warm, list(warm_ranges)))
            .select("key", "value")
            .write.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "warm-sink")
            .save()
        )
        cp_ranges = plan_checkpoint(pipeline, ledger).ranges  # plan once, reuse the ranges for (b)
        ran = sum(r.end - r.start for r in cp_ranges)  # the source is not transactional
        if ran < n:
            log(f"the plan sized the checkpoint to {ran:,} of {n:,} records (its commit must fit")
            log(f"  the transaction timeout): every phase runs and counts those {ran:,}")

        settle()
        log("(b) Spark's at-least-once Kafka sink")
        t = time.monotonic()
        (
            upper(_kafka_source(spark, pipeline, list(cp_ranges)))
            .select("key", "value")
            .write.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "sink-alos")
            .save()
        )
        alos_s = time.monotonic() - t

        settle()
        log("(a) eo: plan -> prepare -> commit")
        t = time.monotonic()
        cp = plan_checkpoint(pipeline, ledger)
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=SparkStager(spark))
        prepared_s = time.monotonic() - t
        settle()  # in a DAG the commit is another task, started after the sensor's poke
        env = {**os.environ, "EO_BENCH_PIPELINE_JSON": pipeline.to_json(), "PYTHONPATH": str(ROOT / "bench")}
        eo = str(Path(sys.executable).with_name("eo"))
        stdout, peak_kb = run_child([eo, "commit", "bench_pipeline:from_env", "--json"], env)
        commit = json.loads(stdout.strip().splitlines()[-1])
        commit_s = float(commit["seconds"])
        # (a) = plan + prepare + the commit's own time (the child interpreter's start-up is
        # left out, as Spark's JVM start-up is left out of (b) by the warm-up).
        eo_s = prepared_s + commit_s
        log(f"    prepare {prepared_s:.1f}s, commit {commit_s:.1f}s (peak RSS {peak_kb / 1024:.0f} MB)")

        settle()
        log("(c) plain producer over the same staged records")
        cp = ledger.get(pipeline.name, cp.checkpoint_id)
        ran = cp.records or 0  # what the checkpoint read and staged, from the ledger
        # A fresh process, like the commit (a warm interpreter sent these 15-25% faster).
        plain_cmd = [sys.executable, __file__, "--plain-send", str(cp.staging_location)]
        plain_cmd += ["--topic", "sink-plain"]
        plain_s = float(json.loads(run_child(plain_cmd, env)[0].strip().splitlines()[-1])["seconds"])
        spark.stop()
        ledger.close()
    finally:
        kafka.wipe()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    requested = "" if ran == n else f" requested={n}"  # the plan cut the checkpoint
    eo_rps, alos_rps = ran / eo_s, ran / alos_s
    commit_rps, plain_rps = ran / commit_s, ran / plain_s
    print(f"eo pipeline        {eo_s:8.1f} s  {eo_rps:12,.0f} rec/s")
    print(f"spark at-least-once{alos_s:8.1f} s  {alos_rps:12,.0f} rec/s")
    print(f"eo commit phase    {commit_s:8.1f} s  {commit_rps:12,.0f} rec/s")
    print(f"plain producer     {plain_s:8.1f} s  {plain_rps:12,.0f} rec/s")
    print(
        f"e2e: records={ran}{requested} eo_rps={eo_rps:.0f} spark_alos_rps={alos_rps:.0f} "
        f"ratio={eo_rps / alos_rps:.2f} "
        f"commit_rps={commit_rps:.0f} plain_rps={plain_rps:.0f} commit_ratio={commit_rps / plain_rps:.2f} "
        f"commit_peak_rss_mb={peak_kb / 1024:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
