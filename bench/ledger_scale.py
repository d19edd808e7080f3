"""Ledger at scale: what a streaming application's start reads from a long-lived SQLite ledger.

    .venv/bin/python bench/ledger_scale.py [--checkpoints 1000000] [--partitions 2] [--repeats 3]

One pipeline with ``--checkpoints`` checkpoints (every tenth ABORTED, the rest COMMITTED,
the last three unfinished: two PREPARED, one PLANNED, as a stream killed with
``max_pending=3`` leaves them) and one range per partition per checkpoint, bulk-loaded
straight into the tables (executemany), not through the protocol. Then it times
``unfinished_checkpoints()`` (core/stream.py), the ledger read ``run_stream`` makes at start,
and checks it returned exactly the three unfinished checkpoints with their ranges.

The last line is machine-readable: ``unfinished_s`` is the median of ``--repeats`` calls
(``first_s`` the first, cold one), ``peak_rss_mb`` the process's peak memory after them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from airflow_provider_eo.core.stream import unfinished_checkpoints
from airflow_provider_eo.ledger import Ledger

PIPE = "bench"
CHUNK = 100_000
UNFINISHED = ("PREPARED", "PREPARED", "PLANNED")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def state_of(i: int, n: int) -> str:
    """Checkpoint ``i`` of ``n``: the last three unfinished, every tenth ABORTED, else COMMITTED."""
    tail = n - len(UNFINISHED)
    if i > tail:
        return UNFINISHED[i - tail - 1]
    return "ABORTED" if i % 10 == 0 else "COMMITTED"


def load(ledger: Ledger, n: int, partitions: int) -> float:
    """Bulk-load ``n`` checkpoints of pipeline ``bench`` and their ranges; seconds taken."""
    ledger.ensure_pipeline(PIPE, "fp")
    naive = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    t0 = time.perf_counter()
    with ledger.engine.begin() as c:
        pid = c.exec_driver_sql("SELECT id FROM eo_pipelines WHERE name = ?", (PIPE,)).scalar_one()
        for lo in range(0, n, CHUNK):
            ids = range(lo + 1, min(n, lo + CHUNK) + 1)
            c.exec_driver_sql(
                "INSERT INTO eo_checkpoints (pipeline_id, checkpoint_id, state, lineage, "
                "planned_at, records) VALUES (?, ?, ?, 1, ?, 10)",
                [(pid, i, state_of(i, n), naive) for i in ids],
            )
            c.exec_driver_sql(
                "INSERT INTO eo_checkpoint_ranges (pipeline_id, checkpoint_id, topic, "
                "partition, start_offset, end_offset) VALUES (?, ?, 't', ?, ?, ?)",
                [(pid, i, p, (i - 1) * 10, i * 10) for i in ids for p in range(partitions)],
            )
            log(f"  loaded {ids[-1]:,}/{n:,} checkpoints")
        c.exec_driver_sql("UPDATE eo_pipelines SET last_checkpoint_id = ? WHERE id = ?", (n, pid))
        c.exec_driver_sql("ANALYZE")
    return time.perf_counter() - t0


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--checkpoints", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.checkpoints
    if n <= len(UNFINISHED) or args.repeats < 1 or args.partitions < 1:
        parser.error(f"--checkpoints must be > {len(UNFINISHED)}, --repeats and --partitions >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(f"sqlite:///{Path(tmp) / 'scale.db'}")
        log(f"sqlite: {n:,} checkpoints x {args.partitions} partitions")
        load_s = load(ledger, n, args.partitions)
        log(f"  loaded in {load_s:.1f}s")
        expected = list(range(n - len(UNFINISHED) + 1, n + 1))
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            found = unfinished_checkpoints(ledger, PIPE)
            samples.append(time.perf_counter() - t0)
            got = [cp.checkpoint_id for cp in found]
            if got != expected or any(len(cp.ranges) != args.partitions for cp in found):
                raise SystemExit(f"wrong answer: unfinished {got}, expected {expected}")
            log(f"  unfinished_checkpoints: {samples[-1]:.4f}s")
        ledger.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"ledger_scale: checkpoints={n} unfinished_s={statistics.median(samples):.4f} "
        f"first_s={samples[0]:.4f} unfinished={len(expected)} partitions={args.partitions} "
        f"load_s={load_s:.1f} peak_rss_mb={peak_mb:.0f}"
    )


if __name__ == "__main__":
    main()
