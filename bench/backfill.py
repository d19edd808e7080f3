"""Backfill benchmark: the lookup of one day's ranges in a ledger of 1M checkpoint ranges, and
a day's backfill against the live pipeline on the same records, same broker, same Spark.

    .venv/bin/python bench/backfill.py [--ranges 1000000] [--records 200000] [--ledger-url URL]

1. Lookup: a live pipeline with ``--ranges`` COMMITTED checkpoint ranges (4 partitions per
   checkpoint) over 365 days is bulk-loaded into a ledger (a SQLite file by default;
   ``--ledger-url`` for an empty PostgreSQL database, loaded with COPY), then
   ``Ledger.committed_ranges_in`` for one day is timed: ``lookup_ms`` is the median of 25.
2. Throughput: ``--records`` source records stamped within one day go through the live
   pipeline (plan + prepare + commit, timed: ``live_rps``), then that day is backfilled into
   another topic (``run_backfill``: ledger lookup, plan, time-filtered prepare, commit,
   timed: ``backfill_rps``), then a second live pipeline processes the same records again
   (``live_rps`` is over both live runs, one before and one after the backfill, counting
   the records the ledger shows each checkpoint read). All after one warm-up checkpoint,
   each phase once the machine is quiet.

The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
DAY = 86_400_000
LIVE = "bench-live"
PARTS = 4


def log(msg: str) -> None:
    print(f"[backfill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_ranges(ledger: Ledger, n_ranges: int, base_ms: int) -> int:
    """Bulk-load COMMITTED checkpoints of LIVE, PARTS ranges each, spread over 365 days;
    returns the span (ms) each checkpoint's ranges cover."""
    ledger.ensure_pipeline(LIVE, "fp")
    checkpoints = n_ranges // PARTS
    step = 365 * DAY // checkpoints  # each checkpoint reads the records of `step` ms
    with ledger.engine.connect() as c:
        pid = c.exec_driver_sql(f"SELECT id FROM eo_pipelines WHERE name = '{LIVE}'").scalar_one()
    now = dt.datetime.now(dt.timezone.utc)

    def cp_rows() -> list[tuple[object, ...]]:
        return [(pid, i, "COMMITTED", 1, now, 100) for i in range(1, checkpoints + 1)]

    def range_rows() -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for i in range(1, checkpoints + 1):
            lo = base_ms + (i - 1) * step
            for p in range(PARTS):
                out.append((pid, i, "src", p, (i - 1) * 25, i * 25, lo + p, lo + step - 1 - p))
        return out

    t0 = time.perf_counter()
    if ledger.dialect == "postgresql":
        raw = ledger.engine.raw_connection()
        try:
            cur = raw.cursor()
            with cur.copy(  # type: ignore[attr-defined]
                "COPY eo_checkpoints (pipeline_id, checkpoint_id, state, lineage, planned_at, records) "
                "FROM STDIN"
            ) as copy:
                for row in cp_rows():
                    copy.write_row(row)
            with cur.copy(  # type: ignore[attr-defined]
                "COPY eo_checkpoint_ranges (pipeline_id, checkpoint_id, topic, partition, start_offset, "
                "end_offset, min_timestamp, max_timestamp) FROM STDIN"
            ) as copy:
                for row in range_rows():
                    copy.write_row(row)
            cur.execute(
                "UPDATE eo_pipelines SET last_checkpoint_id = %s, max_range_span_ms = %s WHERE id = %s",
                (checkpoints, step, pid),
            )
            raw.commit()
        finally:
            raw.close()
        # What a long-lived ledger's autovacuum has done: statistics, hint bits, visibility
        # map (index-only probes); run now so it does not compete with the timed lookups.
        with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("VACUUM ANALYZE")
    else:
        naive = now.replace(tzinfo=None)
        with ledger.engine.begin() as c:
            c.exec_driver_sql(
                "INSERT INTO eo_checkpoints (pipeline_id, checkpoint_id, state, lineage, planned_at, "
                "records) VALUES (?, ?, ?, ?, ?, ?)",
                [(*r[:4], naive, r[5]) for r in cp_rows()],
            )
            c.exec_driver_sql(
                "INSERT INTO eo_checkpoint_ranges (pipeline_id, checkpoint_id, topic, partition, "
                "start_offset, end_offset, min_timestamp, max_timestamp) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                range_rows(),
            )
            c.exec_driver_sql(
                f"UPDATE eo_pipelines SET last_checkpoint_id = {checkpoints}, "
                f"max_range_span_ms = {step} WHERE id = {pid}"
            )
            c.exec_driver_sql("ANALYZE")
    log(f"  {checkpoints * PARTS:,} ranges in {time.perf_counter() - t0:.1f}s")
    return step


def lookup_ms(ledger: Ledger, day_start: int, repeats: int = 25) -> tuple[float, int]:
    """Median ms of one day's committed_ranges_in, and how many offsets it found."""
    for _ in range(3):
        ledger.committed_ranges_in(LIVE, day_start, day_start + DAY)
    samples = []
    found = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = ledger.committed_ranges_in(LIVE, day_start, day_start + DAY)
        samples.append((time.perf_counter() - t0) * 1000)
        found = sum(b - a for parts in got.values() for a, b in parts)
    return statistics.median(samples), found


def produce_day(bootstrap: str, topic: str, n: int, day_ms: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    pad = "x" * 60
    for i in range(n):
        while True:
            try:
                p.produce(
                    topic,
                    key=f"user-{i % 9973}".encode(),
                    value=f'{{"seq":{i:09d},"pad":"{pad}"}}'.encode(),
                    partition=i % PARTS,
                    timestamp=day_ms + (i * 431) % DAY,
                )
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def throughput(n: int, day_ms: int) -> tuple[float, float, int]:
    """(live_rps, backfill_rps, backfilled records) on a fresh local broker."""
    from dataclasses import replace

    from e2e import one_checkpoint_timeout_ms, settle  # bench/ is the script's folder

    from airflow_provider_eo.core.backfill import BackfillRequest, run_backfill
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.spark.stager import SparkStager
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"backfill-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    log("starting a broker")
    bootstrap = kafka.up().bootstrap
    try:
        conf = {"bootstrap.servers": bootstrap}
        for t in ("src", "sink", "sink-again", "sink-bf", "warm-src", "warm-sink", "warm-bf"):
            admin.ensure_topic(conf, t, partitions=PARTS)
        log(f"producing {n:,} records stamped within one day")
        produce_day(bootstrap, "src", n, day_ms)
        produce_day(bootstrap, "warm-src", 10_000, day_ms)
        pipeline = Pipeline(
            name="bench",
            kafka=conf,
            source_topics=["src"],
            sink_topic="sink",
            transform="airflow_provider_eo.examples.transforms:upper",
            ledger_url=f"sqlite:///{work / 'ledger.db'}",
            staging_dir=str(work / "staging"),
            max_records_per_checkpoint=n,
            # The live side reads all n in one checkpoint although nothing is measured yet.
            transaction_timeout_ms=one_checkpoint_timeout_ms(n),
        )
        spark = get_spark("eo-bench-backfill")
        ledger = Ledger(pipeline.ledger_url)

        def prepare(p: Pipeline, led: Ledger, cid: int) -> None:
            prepare_checkpoint(p, led, cid, stager=SparkStager(spark))

        log("warming up: a 10k-record checkpoint and its backfill")
        warm = replace(pipeline, name="warm", source_topics=["warm-src"], sink_topic="warm-sink")
        run_once(warm, ledger=ledger, stager=SparkStager(spark))
        run_backfill(BackfillRequest(warm, day_ms, day_ms + DAY, "warm-bf"), ledger, prepare=prepare)

        settle()
        log("live: plan -> prepare -> commit")
        t = time.monotonic()
        result = run_once(pipeline, ledger=ledger, stager=SparkStager(spark))
        live_s = time.monotonic() - t
        assert result.checkpoint is not None, result.as_dict()
        live_records = result.checkpoint.records or 0  # from the ledger: what really ran
        if live_records < n:
            log(f"  the plan sized the live checkpoint to {live_records:,} of {n:,} records")

        settle()
        log("backfill of the day: lookup -> plan -> filtered prepare -> commit")
        t = time.monotonic()
        request = BackfillRequest(pipeline, day_ms, day_ms + DAY, "sink-bf")
        done = run_backfill(request, ledger, prepare=prepare)
        backfill_s = time.monotonic() - t

        # The live side again, after the backfill (a second pipeline on the same records), so
        # neither side alone profits from running later in a warmer JVM.
        settle()
        log("live again (another pipeline, same records): plan -> prepare -> commit")
        again = replace(pipeline, name="bench-again", sink_topic="sink-again")
        t = time.monotonic()
        result = run_once(again, ledger=ledger, stager=SparkStager(spark))
        live_again_s = time.monotonic() - t
        assert result.checkpoint is not None, result.as_dict()
        live_records += result.checkpoint.records or 0
        log(
            f"  live {live_s:.2f}s, backfill {backfill_s:.2f}s ({len(done.checkpoints)} checkpoint(s)), "
            f"live again {live_again_s:.2f}s"
        )
        ledger.close()
        return live_records / (live_s + live_again_s), done.records / backfill_s, done.records
    finally:
        kafka.down()
        shutil.rmtree(work, ignore_errors=True)  # the broker's data and the staging


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranges", type=int, default=1_000_000)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--ledger-url", default=None, help="an empty PostgreSQL database (default: SQLite)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    midnight = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday = int(midnight.timestamp() * 1000) - DAY

    with tempfile.TemporaryDirectory() as tmp:
        url = args.ledger_url or f"sqlite:///{tmp}/bench.db"
        log(f"ledger {url.split('@')[-1]}: loading {args.ranges:,} ranges over 365 days")
        with Ledger(url) as ledger:
            base = yesterday - 200 * DAY
            load_ranges(ledger, args.ranges, base)
            lookup, offsets = lookup_ms(ledger, base + 100 * DAY)
        log(f"  one day's ranges: {offsets:,} offsets, median {lookup:.2f} ms")

    live_rps, backfill_rps, records = throughput(args.records, yesterday)
    print(
        f"backfill: records={records} lookup_ms={lookup:.2f} backfill_rps={backfill_rps:.0f} "
        f"live_rps={live_rps:.0f} ratio={backfill_rps / live_rps:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
