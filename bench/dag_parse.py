"""DAG parse cost: how long the dag-processor takes to parse the example DAGs in ``dags/``,
and which heavy libraries that parse loads.

Usage: .venv/bin/python bench/dag_parse.py [--repeat 5]

Each round is a fresh Python process (a dag-processor parses in fresh processes too) with a
throwaway AIRFLOW_HOME and this checkout's package first on the path: it imports Airflow's
DAG-parsing machinery (``airflow.sdk``, ``airflow.dag_processing.dagbag.DagBag``; Airflow
loads the installed plugins then, the provider's Exactly-once page among them:
``import_s``), then parses ``dags/`` with a ``DagBag`` (``parse_s``), and lists which of
confluent_kafka, pyarrow, alembic, pyspark, pandas are loaded at the end. ``total_s`` is
the two together, what a parse of these DAG files costs a fresh process. Stdout ends with
one line per round and ``dag_parse: median_total_s=... median_parse_s=... heavy=[...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("confluent_kafka", "pyarrow", "alembic", "pyspark", "pandas")

PROBE = f"""
import json, sys, time
t0 = time.perf_counter()
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag
t1 = time.perf_counter()
bag = DagBag({str(ROOT / "dags")!r})
t2 = time.perf_counter()
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps({{"import_s": t1 - t0, "parse_s": t2 - t1, "total_s": t2 - t0,
                  "dags": len(bag.dag_ids), "errors": len(bag.import_errors), "heavy": heavy}}))
"""


def one_round() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            AIRFLOW_HOME=home,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            # This checkout's DAGs and package (not whichever copy the venv has installed).
            PYTHONPATH=os.pathsep.join([str(ROOT / "dags"), str(ROOT)]),
        )
        out = subprocess.run(
            [sys.executable, "-c", PROBE],
            env=env,
            cwd=home,  # not this folder: "-c" puts the working folder first on sys.path
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rounds = []
    for i in range(args.repeat):
        r = one_round()
        rounds.append(r)
        print(f"round {i + 1}: {json.dumps(r)}", flush=True)
    total = statistics.median(float(r["total_s"]) for r in rounds)  # type: ignore[arg-type]
    parse = statistics.median(float(r["parse_s"]) for r in rounds)  # type: ignore[arg-type]
    heavy = sorted({m for r in rounds for m in r["heavy"]})  # type: ignore[attr-defined]
    print(
        f"dag_parse: median_total_s={total:.3f} median_parse_s={parse:.3f} rounds={len(rounds)} heavy={heavy}"
    )


if __name__ == "__main__":
    main()
