"""Commit scale: records/s of the commit step alone (PREPARED -> COMMITTED), local vs spark.

Usage: .venv/bin/python bench/commit_scale.py [--records 1000000,4000000] [--shards 4]
       [--repeat 1] [--ledger-rows 1000]

For every record count and every mode, a fresh pipeline (its own name, SQLite ledger,
consumer group, and a sink topic with ``--shards`` partitions, ``commit_shards=--shards``:
one partition per shard) reads the same source topic (``--shards`` partitions): a 20k-record warm-up
checkpoint is run once (prepare + a local commit: the broker's transaction coordinator and
the ledger's measured publish rate, which lets the plan size the next checkpoint to N
records under ``transaction_timeout_ms=900000``), then one checkpoint of exactly N records is
planned and prepared in this process (local Spark), and committed in a fresh process:

- ``local``: the committing process publishes the shards itself, one after another;
- ``spark1`` / ``spark2``: ``commit_mode="spark"``, the commit driver's ``spark.master`` is a
  Spark standalone master on 127.0.0.1 whose one worker offers 1 / 2 executor cores. Every
  shard's transaction runs in a Spark task: shards 0..S-2 in parallel (as many at once as
  there are executor cores), then the last shard alone (it moves the consumer group).

The commit time is ``CommitResult.seconds`` (verify the staging, marker checks, every
shard's transaction, the ledger rows, mark COMMITTED). The SparkSession start of a spark
commit is not in it and is reported apart (``session_s``: getOrCreate, the executor
registered, one trivial task per executor core importing the commit's modules): the
stream and ``eo run-once`` already have a session, a lone ``eo commit`` pays it. Each commit
is verified (untimed) by reading the whole sink back read_committed: by each record's
provenance header exactly N records of the checkpoint (N distinct source offsets) and the
warm-up's 20k, nothing else, no record twice, else the benchmark fails (SystemExit).

Then ``ledger_shard_rows_per_s``: shard rows per second the driver can record on a
migrated PostgreSQL ledger (scripts/postgres.sh; stopped again if this run started it),
each row a ``record_shard`` PENDING + COMMITTED pair (with its ``publish`` event), one
after another as the commit driver writes them.

Stdout ends with one ``commit_scale: records=...`` line per record count, one
``commit_scale: ledger_shard_rows_per_s=...`` line and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # eo_spark_standalone.StandaloneCluster

from airflow_provider_eo.pipeline import Pipeline  # noqa: E402

WARM_RECORDS = 20_000
MODES = ("local", "spark1", "spark2")
CORES = {"spark1": 1, "spark2": 2}
TIMEOUT_MS = 900_000


def log(msg: str) -> None:
    print(f"[commit_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the commit, in a fresh process ----------------------------------------------------------


def cpu_seconds(broker_pid: int) -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of the broker process) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    stat = Path(f"/proc/{broker_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return busy / tick, (int(stat[11]) + int(stat[12])) / tick  # utime + stime


def _warm_python_worker(_it: Any) -> Any:
    """A trivial task that imports what a commit task imports (runs on an executor)."""
    import confluent_kafka  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import airflow_provider_eo.spark.commit  # noqa: F401

    yield os.getpid()


def commit_child(checkpoint_id: int, mode: str) -> int:
    """``--commit-child``: commit one checkpoint (pipeline from $EO_BENCH_PIPELINE_JSON) and
    print one JSON line: the commit's own seconds, the session start apart."""
    from airflow_provider_eo.core.commit import commit_checkpoint
    from airflow_provider_eo.ledger import Ledger

    pipeline = Pipeline.from_json(os.environ["EO_BENCH_PIPELINE_JSON"])
    ledger = Ledger(pipeline.ledger_url)
    runner = None
    session_s = 0.0
    if mode == "spark":
        from airflow_provider_eo.spark.commit import SparkShardRunner
        from airflow_provider_eo.spark.session import get_spark

        t = time.monotonic()
        # The session SparkShardRunner would start for `eo commit` (same name and settings).
        spark = get_spark(f"eo-commit-{pipeline.name}", {"spark.speculation": "false", **pipeline.spark_conf})
        sc = spark.sparkContext
        deadline = time.monotonic() + 120
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 2:  # the driver + one executor
            if time.monotonic() > deadline:
                raise SystemExit("no executor registered within 120 s")
            time.sleep(0.05)
        slots = int(os.environ["EO_BENCH_SLOTS"])
        sc.parallelize(range(slots), slots).mapPartitions(_warm_python_worker).collect()
        session_s = time.monotonic() - t
        runner = SparkShardRunner(pipeline, spark)
    else:
        # The same warm-up the executors' Python workers get: the modules a commit imports
        # lazily (pyarrow.parquet on the first staged file), so neither mode pays them in
        # its measured commit.
        for _ in _warm_python_worker(iter(())):
            pass
    broker_pid = int(os.environ["EO_BENCH_BROKER_PID"])
    busy0, broker0 = cpu_seconds(broker_pid)
    result = commit_checkpoint(pipeline, ledger, checkpoint_id, commit_mode=mode, runner=runner)
    busy1, broker1 = cpu_seconds(broker_pid)
    ledger.close()
    print(
        json.dumps(
            {
                "commit_s": result.seconds,
                "session_s": session_s,
                "busy_cpu_s": busy1 - busy0,
                "broker_cpu_s": broker1 - broker0,
                "published": result.published,
                "mode": result.mode,
                "state": result.checkpoint.state.value,
                "pid": os.getpid(),
                "publishers": [p.as_dict() for p in sorted(result.publishers, key=lambda p: p.shard)],
            }
        ),
        flush=True,
    )
    return 0


# -- PostgreSQL ledger: shard rows per second ------------------------------------------------


def ledger_shard_rows(rows: int, shards_per_checkpoint: int = 100) -> dict[str, Any]:
    """Shard rows/s (PENDING + COMMITTED per row, the COMMITTED one with its publish event)
    on a fresh migrated PostgreSQL ledger, one write after another as the driver makes them."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from airflow_provider_eo.ledger import Ledger, RangeSpec

    script = ROOT / "scripts" / "postgres.sh"
    out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"scripts/postgres.sh start failed: {out.stderr[-2000:]}")
    info = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    server, started = info["EO_PG_URL"], info.get("EO_PG_STARTED") == "1"
    log(f"PostgreSQL {'started' if started else 'already running'}: measuring {rows} shard rows")
    db = f"eo_commit_scale_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(server).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{db}"')
        try:
            ledger = Ledger(make_url(server).set(database=db).render_as_string(hide_password=False))
            ledger.ensure_pipeline("shards", "fp")
            checkpoints = max(1, rows // shards_per_checkpoint)

            def record(cid: int, shard: int) -> None:
                for state in ("PENDING", "COMMITTED"):
                    ledger.record_shard(
                        "shards",
                        cid,
                        shard,
                        transactional_id=f"eo-shards-{shard}",
                        producer_id=None,
                        producer_epoch=None,
                        state=state,
                        records=1000,
                        publish_s=0.5 if state == "COMMITTED" else None,
                    )

            cids = []
            seconds = 0.0
            for i in range(checkpoints + 1):  # the first one warms up (connections, caches)
                cid = ledger.plan("shards", [RangeSpec("t", 0, i * 10, i * 10 + 10)]).checkpoint_id
                ledger.mark_prepared(
                    "shards",
                    cid,
                    attempt="a",
                    staging_location="s",
                    records=10,
                    bytes_=10,
                    shard_counts={0: 10},
                )
                t = time.perf_counter()
                for shard in range(shards_per_checkpoint if i else 20):
                    record(cid, shard)
                if i:
                    seconds += time.perf_counter() - t
                    cids.append(cid)
                ledger.mark_committed("shards", cid)
            n = checkpoints * shards_per_checkpoint
            shard_rows = sum(len(ledger.get("shards", cid).shards) for cid in cids)
            if shard_rows != n:
                raise SystemExit(f"ledger: {shard_rows} shard rows recorded, expected {n}")
            ledger.close()
        finally:
            with admin.connect() as c:
                c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    finally:
        admin.dispose()
        if started:
            subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)
            log("PostgreSQL stopped")
    return {"rows": n, "seconds": seconds, "rows_per_s": n / seconds, "ms_per_row": 1000 * seconds / n}


# -- one measurement -------------------------------------------------------------------------


def run_child(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"the commit child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def verify(pipeline: Pipeline, ledger: Any, checkpoint_id: int, records: int) -> float:
    """Read the whole sink back read_committed (as its consumers see it) and check, by each
    record's provenance header: exactly ``records`` records of the checkpoint and
    ``WARM_RECORDS`` of the warm-up, nothing else, no record twice (by sink position and by
    source offset). Raises SystemExit otherwise. Returns its seconds.

    The same evidence the auditor (core/audit.py) counts, streamed (``iter_topic``) instead
    of held as a list of messages (the auditor read 1M records back in ~35 s here)."""
    from collections import Counter

    from airflow_provider_eo import names
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.audit import iter_topic, settled_ends
    from airflow_provider_eo.kafka.client_config import librdkafka_config

    t = time.monotonic()
    config = librdkafka_config(pipeline.kafka)
    topic = pipeline.sink_topic
    identity = ledger.get_pipeline(pipeline.name).identity
    field = {
        cid: names.provenance_checkpoint_field(pipeline.name, cid, identity).encode()
        for cid in (checkpoint_id - 1, checkpoint_id)
    }
    parts = admin.partitions_of(config, [topic])[topic]
    ends = settled_ends(config, [(topic, p) for p in parts])
    per_field: Counter[bytes] = Counter()
    seen: set[bytes] = set()  # whole header values: checkpoint, sink position, source offset
    sources: dict[bytes, set[bytes]] = {f: set() for f in field.values()}
    total = 0
    unread: list[str] = []
    try:
        for msg in iter_topic(config, topic, ends, isolation="read_committed", timeout_s=600):
            total += 1
            header = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
            prov = header if isinstance(header, bytes) else b""
            seen.add(prov)
            # checkpoint field, sink position, source offset (either form of the header)
            ckpt, _position, src = names.parse_provenance(prov) or (b"", b"", b"")
            per_field[ckpt] += 1
            if ckpt in sources:
                sources[ckpt].add(src)
    except TimeoutError as exc:
        unread.append(str(exc))
    warm, main = field[checkpoint_id - 1], field[checkpoint_id]
    found = {
        "sink_records": total,
        "distinct": len(seen),
        "checkpoint": per_field[main],
        "checkpoint_sources": len(sources[main]),
        "warm_up": per_field[warm],
        "warm_up_sources": len(sources[warm]),
        "unread_partitions": unread,
    }
    expected = {
        "sink_records": records + WARM_RECORDS,
        "distinct": records + WARM_RECORDS,
        "checkpoint": records,
        "checkpoint_sources": records,
        "warm_up": WARM_RECORDS,
        "warm_up_sources": WARM_RECORDS,
        "unread_partitions": [],
    }
    if found != expected or ledger.get(pipeline.name, checkpoint_id).records != records:
        raise SystemExit(
            f"VERIFICATION FAILED: {pipeline.name} checkpoint {checkpoint_id}: the sink holds "
            f"{json.dumps(found)}, expected {json.dumps(expected)}"
        )
    return time.monotonic() - t


def wait_for_topic(config: dict[str, Any], topic: str, partitions: int) -> None:
    """Until the new topic's metadata shows all its partitions (a fresh topic right after
    CreateTopics can still be unknown to the next metadata request)."""
    from airflow_provider_eo.kafka import admin

    deadline = time.monotonic() + 60
    while True:
        try:
            if len(admin.partitions_of(config, [topic])[topic]) == partitions:
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic} did not show {partitions} partitions within 60 s")
        time.sleep(0.2)


def measure(
    base: Pipeline,
    mode: str,
    records: int,
    source: str,
    rep: int,
    work: Path,
    spark: Any,
    master: str | None,
    broker_pid: int,
) -> dict[str, Any]:
    from e2e import settle

    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.spark.stager import SparkStager

    tag = f"cs-{mode}-{records}-{rep}-{uuid.uuid4().hex[:6]}"
    spark_conf = {}
    if master is not None:
        spark_conf = {
            "spark.master": master,
            "spark.executor.memory": "1g",
            "spark.ui.enabled": "false",
        }
    pipeline = replace(
        base,
        name=tag,
        source_topics=[source],
        sink_topic=f"{tag}-sink",
        ledger_url=f"sqlite:///{work / (tag + '.db')}",
        staging_dir=str(work / "staging" / tag),
        max_records_per_checkpoint=records,
        spark_conf=spark_conf,
    )
    admin.ensure_topic(pipeline.kafka, pipeline.sink_topic, partitions=base.commit_shards)
    wait_for_topic(dict(pipeline.kafka), pipeline.sink_topic, base.commit_shards)
    ledger = Ledger(pipeline.ledger_url)
    stager = SparkStager(spark)
    warm = run_once(
        replace(pipeline, max_records_per_checkpoint=WARM_RECORDS, commit_mode="local"),
        ledger=ledger,
        stager=stager,
    )
    if warm.checkpoint is None or (warm.checkpoint.records or 0) != WARM_RECORDS:
        raise SystemExit(f"warm-up checkpoint: {warm}")
    t = time.monotonic()
    cp = plan_checkpoint(pipeline, ledger)
    if cp is None or warm.checkpoint.checkpoint_id != cp.checkpoint_id - 1:
        raise SystemExit(f"expected the checkpoint after the warm-up's, got {cp}")
    if sum(r.end - r.start for r in cp.ranges) != records:
        raise SystemExit(f"the plan did not size the checkpoint to {records} records: {cp}")
    prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager)
    prepare_s = time.monotonic() - t
    staged = ledger.get(pipeline.name, cp.checkpoint_id).records
    if staged != records:
        raise SystemExit(f"prepared {staged} records, expected {records}")
    log(f"  {mode} {records:,} #{rep + 1}: prepared checkpoint {cp.checkpoint_id} in {prepare_s:.1f}s")
    settle()
    env = {
        **os.environ,
        "EO_BENCH_PIPELINE_JSON": pipeline.to_json(),
        "EO_BENCH_SLOTS": str(CORES.get(mode, 1)),
        "EO_BENCH_BROKER_PID": str(broker_pid),
        "PYTHONPATH": str(ROOT / "bench"),
    }
    commit_mode = "local" if mode == "local" else "spark"
    cmd = [sys.executable, __file__, "--commit-child", str(cp.checkpoint_id), "--mode", commit_mode]
    out = run_child(cmd, env)
    if out["mode"] != commit_mode or out["published"] != records or out["state"] != "COMMITTED":
        raise SystemExit(f"commit of {records} records in {commit_mode} mode: {out}")
    publishers = out["publishers"]
    if commit_mode == "spark" and any(p["executor"] in ("driver", "local", "unknown") for p in publishers):
        raise SystemExit(f"a spark-mode shard was not published by an executor: {publishers}")
    if sum(p["records"] for p in publishers) != records or len(publishers) != base.commit_shards:
        raise SystemExit(f"publishers do not add up to {records} records in {base.commit_shards} shards")
    rps = records / out["commit_s"]
    # Each shard's transaction time (begin -> commit), as the ledger recorded it.
    timed = {
        int(e.details["shard"]): float(e.details["seconds"])
        for e in ledger.events(pipeline.name, cp.checkpoint_id)
        if e.kind == "publish"
    }
    shard_s = [timed.get(s) for s in range(base.commit_shards)]
    counts = {int(p["shard"]): int(p["records"]) for p in publishers}
    session = f", session start {out['session_s']:.1f}s (not counted)" if commit_mode == "spark" else ""
    log(
        f"  {mode} {records:,} #{rep + 1}: commit {out['commit_s']:.2f}s = {rps:,.0f} rec/s{session}; "
        "shard transactions " + " ".join(f"{s:.2f}s" if s is not None else "-" for s in shard_s)
    )
    log(
        f"  {mode} {records:,} #{rep + 1}: CPU during the commit: {out['busy_cpu_s']:.1f} core-s in all "
        f"({out['busy_cpu_s'] / out['commit_s']:.2f} cores busy), broker {out['broker_cpu_s']:.1f} s"
    )
    audit_s = verify(pipeline, ledger, cp.checkpoint_id, records)
    log(f"  {mode} {records:,} #{rep + 1}: verified ({records:,} records exactly once; audit {audit_s:.1f}s)")
    ledger.close()
    shutil.rmtree(pipeline.staging_dir, ignore_errors=True)
    try:  # free the broker's disk: the sink was verified
        client = admin.admin_client(pipeline.kafka)
        client.delete_topics([pipeline.sink_topic])[pipeline.sink_topic].result(60)
    except Exception as exc:
        log(f"  (could not delete {pipeline.sink_topic}: {exc})")
    return {
        "mode": mode,
        "records": records,
        "commit_s": round(out["commit_s"], 3),
        "rps": round(rps),
        "session_s": round(out["session_s"], 2),
        "prepare_s": round(prepare_s, 2),
        "shard_publish_s": [None if s is None else round(s, 3) for s in shard_s],
        "shard_rps": [
            None if s is None or not s else round(counts.get(i, 0) / s) for i, s in enumerate(shard_s)
        ],
        "busy_cpu_s": round(out["busy_cpu_s"], 2),
        "broker_cpu_s": round(out["broker_cpu_s"], 2),
        "executors": sorted({str(p["executor"]) for p in publishers}),
    }


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--records", default="1000000,4000000", help="comma-separated record counts")
    ap.add_argument("--shards", type=int, default=4, help="commit_shards = sink partitions")
    ap.add_argument("--repeat", type=int, default=1, help="measurements per mode and count (median)")
    ap.add_argument("--ledger-rows", type=int, default=1000, help="shard rows timed on PostgreSQL")
    ap.add_argument("--modes", default=",".join(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--commit-child", type=int, metavar="CHECKPOINT", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="local", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.commit_child is not None:
        return commit_child(args.commit_child, args.mode)
    sizes = [int(x) for x in args.records.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if args.shards < 1 or args.repeat < 1 or not sizes or any(m not in MODES for m in modes):
        ap.error("--shards and --repeat must be >= 1, --records non-empty")
    # A terminated benchmark still stops what it started (the finally below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from e2e import produce_source
    from eo_spark_standalone import StandaloneCluster

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    started = time.monotonic()
    work = ROOT / ".eo" / "bench" / f"commit-scale-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    clusters: dict[str, StandaloneCluster] = {}
    results: list[dict[str, Any]] = []
    spark = None
    try:
        log("starting a broker")
        broker = kafka.up()
        bootstrap = broker.bootstrap
        conf = {"bootstrap.servers": bootstrap}
        for mode in modes:
            if mode in CORES:
                log(f"starting a Spark standalone master + worker with {CORES[mode]} core(s) ({mode})")
                cluster = StandaloneCluster(work / mode, cores=CORES[mode], memory="2g")
                cluster.up()
                clusters[mode] = cluster
        sources = {}
        for n in sizes:
            sources[n] = f"src-{n}"
            admin.ensure_topic(conf, sources[n], partitions=args.shards)
            log(f"producing {n + WARM_RECORDS:,} source records into {sources[n]} ({args.shards} partitions)")
            produce_source(bootstrap, sources[n], n + WARM_RECORDS, args.shards)
        base = Pipeline(
            name="cs",
            kafka=conf,
            source_topics=["src"],
            sink_topic="sink",
            transform="airflow_provider_eo.examples.transforms:upper",
            ledger_url="sqlite://",
            staging_dir=str(work / "staging"),
            commit_shards=args.shards,
            commit_mode="local",
            transaction_timeout_ms=TIMEOUT_MS,
            keep_committed_staging=1,
        )
        log("starting the local Spark session that prepares the checkpoints")
        spark = get_spark("eo-commit-scale-prepare", {"spark.ui.showConsoleProgress": "false"})
        for n in sizes:
            for rep in range(args.repeat):
                for mode in modes:
                    master = clusters[mode].master_url if mode in clusters else None
                    results.append(measure(base, mode, n, sources[n], rep, work, spark, master, broker.pid))
        spark.stop()
        spark = None
        for cluster in clusters.values():
            cluster.down()
        clusters.clear()
        kafka.wipe()
        ledger = ledger_shard_rows(args.ledger_rows)
    finally:
        if spark is not None:
            spark.stop()
        for cluster in clusters.values():
            cluster.down()
        kafka.wipe()
        shutil.rmtree(work, ignore_errors=True)

    summary: dict[str, Any] = {
        "shards": args.shards,
        "sink_partitions": args.shards,
        "repeat": args.repeat,
        "cores": os.cpu_count(),
        "transaction_timeout_ms": TIMEOUT_MS,
        "measurements": results,
        "ledger_postgresql": {k: round(v, 3) if isinstance(v, float) else v for k, v in ledger.items()},
        "total_s": round(time.monotonic() - started),
    }
    medians: dict[int, dict[str, float]] = {}
    for n in sizes:
        medians[n] = {}
        for mode in modes:
            runs = [r for r in results if r["records"] == n and r["mode"] == mode]
            medians[n][mode] = statistics.median(r["rps"] for r in runs)
            if mode in CORES:
                medians[n][f"{mode}_session_s"] = statistics.median(r["session_s"] for r in runs)
    summary["median_rps"] = {str(n): m for n, m in medians.items()}
    for n in sizes:
        rps = " ".join(f"{m}_rps={medians[n][m]:.0f}" for m in modes)
        print(f"commit_scale: records={n} {rps}")
    print(f"commit_scale: ledger_shard_rows_per_s={ledger['rows_per_s']:.0f}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
