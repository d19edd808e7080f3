"""Where a large checkpoint's time goes: the prepare's Spark job taken apart, step by step,
next to Spark's own read -> transform -> Kafka write of the same records, and the commit.

    .venv/bin/python bench/profile_prepare.py [--records 500000] [--partitions 4] [--repeat 3]
                                              [--warm 4] [--only NAME,...]
                                              [--fetch-max-wait-ms MS] [--cprofile FILE]

One local broker (127.0.0.1), one local SparkSession (local[2], eo's defaults). Every variant
reads the same ``--records`` records (one range per source partition, read_committed, eo's
reader options) and runs ``--warm`` unmeasured times, then ``--repeat`` measured times (the
JVM's JIT keeps compiling for several 500k-record jobs; see bench/stream.py). Variants:

- ``read``: the bounded read alone (``noop`` sink);
- ``transform``: + the example transform (``upper``);
- ``shape``: + provenance, the staged columns, the sink partition, record sizes, the range
  and limit observations (everything prepare computes per record);
- ``sort``: + the sort into staged order;
- ``stage``: the staged Parquet write (spark/write.py), the prepare's whole Spark job;
- ``prepare``: ``prepare_checkpoint`` of a planned checkpoint (the job plus the driver's
  steps: ledger, manifest); the pipeline's creation and its ``plan_checkpoint`` run before
  the measured window (the plan's median is ``plan_s`` of the breakdown line);
- ``commit``: ``commit_checkpoint`` of that prepared checkpoint (re-read the staging,
  publish in Kafka transactions);
- ``spark_kafka``: Spark's own batch read -> ``upper`` -> Kafka sink (at-least-once).

``--fetch-max-wait-ms`` sets the pipeline's ``java.fetch.max.wait.ms`` (eo's reads use 20 ms
unless it is set: spark/source.py ``FETCH_MAX_WAIT_MS``; 500 is the Java client's default).

With ``prepare`` measured, a breakdown of each measured prepare from Spark's own job records
(the driver's status store: every job's submission and completion time): the Spark jobs'
seconds, the driver's time before the first job (ledger, broker lookups, building the
DataFrame, planning) and after the last one (listing the staged files, manifest, ledger), and
the fixed cost beyond the jobs (prepare - jobs), and the staged write's SQL execution taken
apart (see :func:`breakdown`). Printed before the profile line as
``prepare_breakdown: records= prepare_s= spark_jobs_s= jobs= before_first_job_s=
after_last_job_s= fixed_s= driver_before_write_s= write_planning_s= write_commit_s=
driver_after_write_s= plan_s=`` (medians; ``plan_s``: the checkpoint's ``plan_checkpoint``,
outside the prepare's window).

``--cprofile FILE`` runs the measured prepares and commits under Python's profiler and writes its stats to
FILE (read them with ``python -m pstats FILE``): where the driver's own time goes.

Progress goes to stderr; the last line on stdout is machine-readable
(``profile: <variant>_s=<median seconds> ...``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from airflow_provider_eo.pipeline import Pipeline  # noqa: E402

VARIANTS = ("read", "transform", "shape", "sort", "stage", "prepare", "commit", "spark_kafka")


def log(msg: str) -> None:
    print(f"[profile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spark_jobs(spark: Any) -> list[tuple[float, float]]:
    """(submitted, completed) wall-clock seconds of every finished job the driver's status
    store remembers (it keeps them with the UI off too; ``spark.ui.retainedJobs``)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None)
    out = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        submitted, completed = job.submissionTime(), job.completionTime()
        if submitted.isDefined() and completed.isDefined():
            out.append((submitted.get().getTime() / 1000, completed.get().getTime() / 1000))
    return out


def sql_executions(spark: Any) -> list[tuple[float, float]]:
    """(submitted, completed) wall-clock seconds of every finished SQL execution (a DataFrame
    write is one: its planning, its jobs and its job commit) in the SQL status store."""
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    out = []
    for i in range(executions.size()):
        ex = executions.apply(i)
        completed = ex.completionTime()
        if completed.isDefined():
            out.append((ex.submissionTime() / 1000, completed.get().getTime() / 1000))
    return out


def breakdown(spark: Any, windows: list[tuple[float, float]], records: int) -> str:
    """The ``prepare_breakdown`` line: per measured prepare (its wall-clock span), the Spark
    jobs that ran inside it; medians over the prepares.

    The staged write is one SQL execution: ``driver_before_write_s`` is the prepare's time
    before it starts (ledger, broker lookups, building the DataFrame, the write's analysis),
    ``write_planning_s`` from its start to its first job (the query's optimization and
    physical planning, which asks the broker for the source's partitions, and the output
    committer's job setup), ``write_commit_s`` from its last job's end to its own (the job
    commit), ``driver_after_write_s`` the rest (listing the staged files, manifest, ledger).
    """
    jobs = spark_jobs(spark)
    executions = sql_executions(spark)
    rows = []
    for start, end in windows:
        inside = sorted((s, e) for s, e in jobs if start <= s and e <= end)
        busy = sum(e - s for s, e in inside)
        before = (inside[0][0] - start) if inside else end - start
        after = (end - inside[-1][1]) if inside else 0.0
        # The write's execution holds its jobs (Spark also records the inner query of the write
        # command as a nested execution, which does not).
        writes = [
            (s, e)
            for s, e in executions
            if inside and start <= s <= inside[0][0] and inside[-1][1] <= e <= end
        ]
        if writes:
            w_start, w_end = min(writes)
            split = (w_start - start, inside[0][0] - w_start, w_end - inside[-1][1], end - w_end)
        else:  # no job (nothing to read): all of it is the driver's
            split = (before, 0.0, 0.0, after)
        rows.append((end - start, busy, len(inside), before, after, *split))
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    return (
        f"prepare_breakdown: records={records} prepare_s={med[0]:.2f} spark_jobs_s={med[1]:.2f} "
        f"jobs={med[2]:g} before_first_job_s={med[3]:.2f} after_last_job_s={med[4]:.2f} "
        f"fixed_s={med[0] - med[1]:.2f} driver_before_write_s={med[5]:.2f} "
        f"write_planning_s={med[6]:.2f} write_commit_s={med[7]:.2f} driver_after_write_s={med[8]:.2f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per variant (median)")
    ap.add_argument("--warm", type=int, default=4, help="unmeasured runs per variant first")
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    ap.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="the pipeline's java.fetch.max.wait.ms (default: eo's, spark/source.py)",
    )
    ap.add_argument(
        "--cprofile", default=None, help="write the measured prepares' and commits' cProfile stats here"
    )
    args = ap.parse_args()
    only = [v for v in args.only.split(",") if v]
    unknown = sorted(set(only) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")

    from e2e import one_checkpoint_timeout_ms
    from stream import TRANSFORM, produce_backlog  # bench/ is the script's folder

    from airflow_provider_eo.core.commit import commit_checkpoint
    from airflow_provider_eo.core.plan import plan_checkpoint
    from airflow_provider_eo.core.prepare import prepare_checkpoint
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.ledger import Ledger, RangeSpec
    from airflow_provider_eo.spark import shape, source, write
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.spark.stager import SparkStager
    from airflow_provider_eo.spark.transform import load_transform
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"profile-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    log("starting a broker")
    bootstrap = kafka.up().bootstrap
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if args.fetch_max_wait_ms is not None:
        conf["java.fetch.max.wait.ms"] = str(args.fetch_max_wait_ms)
    ledger = None
    spark = None
    try:
        admin.ensure_topic(conf, "src", partitions=args.partitions)
        log(f"producing {args.records:,} records")
        produce_backlog(bootstrap, "src", args.records, args.partitions)
        spark = get_spark("eo-bench-profile", {"spark.ui.showConsoleProgress": "false"})
        ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
        n = 0

        def pipeline() -> Pipeline:
            nonlocal n
            n += 1
            admin.ensure_topic(conf, f"sink-{n}", partitions=args.partitions)
            return Pipeline(
                name=f"profile-{n}",
                # One reader group for every pipeline, as a stream's checkpoints have: Spark's
                # executors then reuse their pooled Kafka consumers (spark/source.py), which
                # a new group per pipeline would deny the prepares but not spark_kafka.
                kafka={**conf, "java.group.id": "eo-read.profile"},
                source_topics=["src"],
                sink_topic=f"sink-{n}",
                transform=TRANSFORM,
                ledger_url=f"sqlite:///{work / 'ledger.db'}",
                staging_dir=str(work / "staging"),
                max_records_per_checkpoint=args.records,
                # Every pipeline is new: its one checkpoint may plan all the records.
                transaction_timeout_ms=one_checkpoint_timeout_ms(args.records),
            )

        base = pipeline()
        # produce_backlog puts record i on partition i % partitions.
        per = [len(range(p, args.records, args.partitions)) for p in range(args.partitions)]
        ranges = [RangeSpec("src", p, 0, per[p]) for p in range(args.partitions)]
        transform = load_transform(TRANSFORM)

        def shaped() -> Any:
            frame = source.read_ranges(spark, base, ranges)
            from pyspark.sql import Observation

            metrics = source.range_metrics(ranges)
            frame = frame.observe(Observation(uuid.uuid4().hex), *metrics)
            out = transform(source.with_provenance(frame))
            staged = shape.staged_frame(out, args.partitions, "profile", frame)
            return shape.observe_limits(staged, Observation(uuid.uuid4().hex), 1_000_000, args.partitions)

        planned_cps: list[tuple[Pipeline, int]] = []
        prepared: list[tuple[Pipeline, int]] = []
        plan_times: list[float] = []

        def do_plan() -> None:
            # A new pipeline (its sink topic created) and its plan: the setup of a measured
            # prepare, so neither is inside the prepare's window; the plan's time is reported
            # as plan_s.
            p = pipeline()
            t0 = time.monotonic()
            cp = plan_checkpoint(p, ledger)
            plan_times.append(time.monotonic() - t0)
            assert cp is not None
            planned = sum(r.end - r.start for r in cp.ranges)
            if planned != args.records:  # every variant must read the same records
                raise SystemExit(
                    f"the plan sized the checkpoint to {planned:,} of {args.records:,} records (its "
                    "commit must fit the transaction timeout): run with fewer --records"
                )
            planned_cps.append((p, cp.checkpoint_id))

        def prepare_planned() -> None:
            p, cid = planned_cps.pop()
            prepare_checkpoint(p, ledger, cid, stager=SparkStager(spark))
            prepared.append((p, cid))

        def do_prepare() -> None:
            do_plan()
            prepare_planned()

        def do_commit() -> None:
            p, cid = prepared.pop()
            commit_checkpoint(p, ledger, cid)

        def spark_kafka() -> None:
            p = pipeline()
            (
                transform(spark.read.format("kafka").options(**source.reader_options(base, ranges)).load())
                .selectExpr("key", "value")
                .write.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("topic", p.sink_topic)
                .save()
            )

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        steps: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {
            "read": (lambda: noop(source.read_ranges(spark, base, ranges)), None),
            "transform": (lambda: noop(transform(source.read_ranges(spark, base, ranges))), None),
            "shape": (lambda: noop(shaped()), None),
            "sort": (lambda: noop(shaped().sortWithinPartitions(*shape.STAGED_ORDER)), None),
            "stage": (
                lambda: write.write_staged(shaped(), str(work / "stage" / uuid.uuid4().hex), args.partitions),
                None,
            ),
            "prepare": (prepare_planned, do_plan),
            "commit": (do_commit, do_prepare),
            "spark_kafka": (spark_kafka, None),
        }
        import cProfile

        profiler = cProfile.Profile() if args.cprofile else None
        plan_s = 0.0
        medians: dict[str, float] = {}
        windows: dict[str, list[tuple[float, float]]] = {}  # measured runs' wall-clock spans
        for name in only:
            run, setup = steps[name]
            times = []
            for i in range(args.warm + args.repeat):
                if setup is not None:
                    setup()
                measured = i >= args.warm
                profiled = profiler is not None and measured and name in ("prepare", "commit")
                t0, wall0 = time.monotonic(), time.time()
                if profiled:
                    profiler.enable()
                run()
                if profiled:
                    profiler.disable()
                took = time.monotonic() - t0
                if measured:
                    times.append(took)
                    windows.setdefault(name, []).append((wall0, time.time()))
                log(f"{name} {'run' if measured else 'warm-up'} {i + 1}: {took:.2f}s")
            medians[name] = statistics.median(times)
            if name == "prepare":  # the plans of its measured runs (the commit's setup plans too)
                plan_s = statistics.median(plan_times[-args.repeat :])
            log(f"{name}: median {medians[name]:.2f}s of {args.repeat} ({args.records:,} records)")
        if profiler is not None:
            profiler.dump_stats(args.cprofile)
            log(f"cProfile stats of the measured prepares and commits: {args.cprofile}")
        if "prepare" in windows:
            print(f"{breakdown(spark, windows['prepare'], args.records)} plan_s={plan_s:.2f}", flush=True)
        print("profile: " + " ".join(f"{k}_s={v:.2f}" for k, v in medians.items()))
        return 0
    finally:
        if spark is not None:
            spark.stop()
        if ledger is not None:
            ledger.close()
        kafka.down()
        shutil.rmtree(work, ignore_errors=True)  # staged output of every run: GBs at 500k


if __name__ == "__main__":
    sys.exit(main())
