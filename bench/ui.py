"""The "Exactly-once" page's API with 100k checkpoints: every endpoint's latency.

    .venv/bin/python bench/ui.py [--checkpoints 100000] [--ledger-url URL]

A pipeline run by a DAG and one run from the CLI (no DAG id on any checkpoint: the
overview's DAG lookup finds none) get ``--checkpoints`` COMMITTED checkpoints each, two
partitions per checkpoint, bulk-inserted into a ledger (a SQLite file by default,
``--ledger-url`` for an empty PostgreSQL database). Then each endpoint is called through
the app (FastAPI's test client: routing, validation, the ledger queries, JSON; the caller's
access decided by a stub, the auth manager is not what is measured) 30 times after one
warm-up: the median and the worst, in ms. Target: every page under 300 ms.

The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEAT = 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=100_000)
    parser.add_argument("--ledger-url", default=None, help="an empty database (default: a temp SQLite file)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eo-ui-bench-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow"))
    url = args.ledger_url or f"sqlite:///{work}/ledger.db"
    os.environ["EO_LEDGER_URL"] = url
    os.environ.pop("EO_LEDGER_CONN_ID", None)

    from fastapi.testclient import TestClient

    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.ledger.urls import redact_url
    from airflow_provider_eo.testing.ledger_fill import bulk_history
    from airflow_provider_eo.ui import app as ui_app
    from airflow_provider_eo.ui.lag import LagCache

    parts = [("bench-src", 0), ("bench-src", 1)]
    t0 = time.monotonic()
    with Ledger(url) as ledger:
        for name, dag_id in (("bench-dag", "eo_pipeline"), ("bench-cli", None)):
            print(
                f"ui-bench: loading {args.checkpoints} checkpoints of {name} into {redact_url(url)} ...",
                flush=True,
            )
            bulk_history(ledger, name, parts, count=args.checkpoints, dag_id=dag_id)
    print(f"ui-bench: loaded in {time.monotonic() - t0:.1f}s", flush=True)

    app = ui_app.create_app()
    app.dependency_overrides[ui_app._access] = lambda: ui_app.Access("bench", lambda **kw: True)
    # Lag from a stub: the page never waits on Kafka, so Kafka's latency is not the page's.
    ends = {tp: 10 * args.checkpoints + 5 for tp in parts}
    app.state.eo.lag = LagCache(lambda partitions, timeout: {tp: ends[tp] for tp in partitions})
    client = TestClient(app)
    mid = args.checkpoints // 2
    calls = {
        "list": "/api/pipelines",
        "overview": "/api/pipelines/bench-dag",
        "overview_cli": "/api/pipelines/bench-cli",
        "history": "/api/pipelines/bench-dag/checkpoints?limit=50",
        "deep_page": f"/api/pipelines/bench-dag/checkpoints?limit=50&before={mid}",
        "lag": "/api/pipelines/bench-dag/lag",
    }
    results: dict[str, tuple[float, float]] = {}
    for key, path in calls.items():
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
        times = []
        for _ in range(REPEAT):
            start = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200
        results[key] = (statistics.median(times), max(times))
        print(
            f"ui-bench: {key:13s} {path:60s} median {results[key][0]:7.2f} ms  max {results[key][1]:7.2f} ms"
        )
    dialect = "pg" if url.startswith("postgresql") else "sqlite"
    fields = " ".join(f"{key}_ms={median:.2f}" for key, (median, _) in results.items())
    worst = max(mx for _, mx in results.values())
    print(f"ui-bench: db={dialect} checkpoints={args.checkpoints} {fields} worst_ms={worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
