"""Ledger benchmark: transitions/s, and unfinished()/last_committed() latency at 10k vs 1M rows.

    .venv/bin/python bench/ledger.py [--rows 10000,1000000] [--pg] [--transitions 300]

Rows are bulk-loaded straight into the tables (executemany on SQLite, COPY on PostgreSQL),
not through the API. The ``*_ms`` numbers are the median of one unfinished() plus one
last_committed() call. The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_provider_eo.ledger import Ledger, RangeSpec

ROOT = Path(__file__).resolve().parents[1]
PIPE = "bench"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _states(n: int) -> list[str]:
    # Mostly committed, some aborted, the last one unfinished: a long-lived pipeline.
    return ["ABORTED" if i % 10 == 0 else "COMMITTED" for i in range(1, n)] + ["PLANNED"]


def load_rows(ledger: Ledger, n: int) -> None:
    ledger.ensure_pipeline(PIPE, "fp")
    with ledger.engine.connect() as c:
        pid = c.exec_driver_sql("SELECT id FROM eo_pipelines WHERE name = 'bench'").scalar_one()
    now = dt.datetime.now(dt.timezone.utc)
    states = _states(n)
    chunk = 100_000
    t0 = time.perf_counter()
    if ledger.dialect == "postgresql":
        raw = ledger.engine.raw_connection()
        try:
            cur = raw.cursor()
            with cur.copy(  # type: ignore[attr-defined]
                "COPY eo_checkpoints (pipeline_id, checkpoint_id, state, lineage, planned_at, "
                "records) FROM STDIN"
            ) as copy:
                for i, state in enumerate(states, start=1):
                    copy.write_row((pid, i, state, 1, now, 10))
                    if i % chunk == 0:
                        log(f"  loaded {i:,}/{n:,} rows")
            with cur.copy(
                "COPY eo_checkpoint_ranges (pipeline_id, checkpoint_id, topic, partition, "
                "start_offset, end_offset) FROM STDIN"
            ) as copy:
                for i in range(1, n + 1):
                    copy.write_row((pid, i, "t", 0, (i - 1) * 10, i * 10))
            cur.execute("UPDATE eo_pipelines SET last_checkpoint_id = %s WHERE id = %s", (n, pid))
            raw.commit()
            cur.execute("ANALYZE")
            raw.commit()
        finally:
            raw.close()
    else:
        naive = now.replace(tzinfo=None)
        with ledger.engine.begin() as c:
            for lo in range(0, n, chunk):
                ids = range(lo + 1, min(n, lo + chunk) + 1)
                c.exec_driver_sql(
                    "INSERT INTO eo_checkpoints (pipeline_id, checkpoint_id, state, lineage, "
                    "planned_at, records) VALUES (?, ?, ?, 1, ?, 10)",
                    [(pid, i, states[i - 1], naive) for i in ids],
                )
                c.exec_driver_sql(
                    "INSERT INTO eo_checkpoint_ranges (pipeline_id, checkpoint_id, topic, "
                    "partition, start_offset, end_offset) VALUES (?, ?, 't', 0, ?, ?)",
                    [(pid, i, (i - 1) * 10, i * 10) for i in ids],
                )
                log(f"  loaded {ids[-1]:,}/{n:,} rows")
            c.exec_driver_sql(f"UPDATE eo_pipelines SET last_checkpoint_id = {n} WHERE id = {pid}")
            c.exec_driver_sql("ANALYZE")
    log(f"  {n:,} rows in {time.perf_counter() - t0:.1f}s")


def query_ms(ledger: Ledger, repeats: int = 200) -> float:
    for _ in range(20):  # warm the pool and the caches
        ledger.unfinished(PIPE)
        ledger.last_committed(PIPE)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        u = ledger.unfinished(PIPE)
        c = ledger.last_committed(PIPE)
        samples.append((time.perf_counter() - t0) * 1000)
        assert u is not None and c is not None
    return statistics.median(samples)


def transitions_per_s(ledger: Ledger, count: int) -> float:
    ledger.ensure_pipeline("tx", "fp")
    t0 = time.perf_counter()
    for i in range(count):
        cp = ledger.plan("tx", [RangeSpec("t", 0, i * 10, i * 10 + 10)]).checkpoint_id
        ledger.mark_prepared(
            "tx", cp, attempt="a", staging_location="s", records=10, bytes_=10, shard_counts={0: 10}
        )
        ledger.mark_committed("tx", cp)
    return 3 * count / (time.perf_counter() - t0)


def pg_start() -> tuple[str, bool]:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return info["EO_PG_URL"], info.get("EO_PG_STARTED") == "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="10000,1000000")
    parser.add_argument("--pg", action="store_true", help="also run on PostgreSQL")
    parser.add_argument("--transitions", type=int, default=300)
    args = parser.parse_args()
    sizes = [int(x) for x in args.rows.split(",")]
    results: dict[str, float] = {}
    tps: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            log(f"sqlite: {n:,} rows")
            ledger = Ledger(f"sqlite:///{tmp}/bench-{n}.db")
            load_rows(ledger, n)
            results[f"sqlite_{n}"] = query_ms(ledger)
            log(f"  unfinished+last_committed median {results[f'sqlite_{n}']:.3f} ms")
            if n == sizes[0]:
                tps["sqlite"] = transitions_per_s(ledger, args.transitions)
                log(f"  transitions/s (plan+prepare+commit): {tps['sqlite']:.0f}")
            ledger.close()
    if args.pg:
        server, started = pg_start()
        admin = create_engine(make_url(server).set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            for n in sizes:
                db = f"eo_bench_{uuid.uuid4().hex[:8]}"
                with admin.connect() as c:
                    c.exec_driver_sql(f'CREATE DATABASE "{db}"')
                try:
                    log(f"postgres: {n:,} rows")
                    ledger = Ledger(make_url(server).set(database=db).render_as_string(False))
                    load_rows(ledger, n)
                    results[f"pg_{n}"] = query_ms(ledger)
                    log(f"  unfinished+last_committed median {results[f'pg_{n}']:.3f} ms")
                    if n == sizes[0]:
                        tps["pg"] = transitions_per_s(ledger, args.transitions)
                        log(f"  transitions/s (plan+prepare+commit): {tps['pg']:.0f}")
                    ledger.close()
                finally:
                    with admin.connect() as c:
                        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        finally:
            admin.dispose()
            if started:
                subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop"], check=False)

    def fmt(key: str) -> str:
        return f"{results[key]:.3f}" if key in results else "na"

    small, large = sizes[0], sizes[-1]
    print(f"ledger-bench: transitions_per_s_pg={tps.get('pg', 0):.0f} (informational)")
    print(
        f"ledger-bench: sqlite_10k_ms={fmt(f'sqlite_{small}')} sqlite_1m_ms={fmt(f'sqlite_{large}')} "
        f"pg_10k_ms={fmt(f'pg_{small}')} pg_1m_ms={fmt(f'pg_{large}')} "
        f"transitions_per_s={tps['sqlite']:.0f}"
    )


if __name__ == "__main__":
    main()
