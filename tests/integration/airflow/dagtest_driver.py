"""Run a DAG with ``dag.test()`` N times in a fresh process (its own AIRFLOW_HOME), with
optional injected faults, and print what happened as one JSON line.

Used by the Airflow integration tests: Airflow reads AIRFLOW_HOME when it is first
imported, so each test drives Airflow from its own process.

    python dagtest_driver.py --dag-module eo_pipeline --runs 3 \
        [--prepare-fault-runs 1] [--commit-fault-runs 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

RESULT_PREFIX = "EO_RESULT "


def _commit_fault(context: Any) -> None:
    """pre_execute hook: crash the first try after the Kafka commit, let the retry run."""
    if context["ti"].try_number == 1:
        os.environ["EO_FAULT"] = "commit.after_commit_txn"
        os.environ["EO_FAULT_ACTION"] = "exit"
    else:
        os.environ.pop("EO_FAULT", None)
        os.environ.pop("EO_FAULT_ACTION", None)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dag-module", required=True)
    parser.add_argument("--dag-attr", default="dag")
    parser.add_argument("--group", default="eo")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--prepare-fault-runs", default="")
    parser.add_argument("--commit-fault-runs", default="")
    args = parser.parse_args()
    prepare_faults = {int(x) for x in args.prepare_fault_runs.split(",") if x}
    commit_faults = {int(x) for x in args.commit_fault_runs.split(",") if x}

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    module = importlib.import_module(args.dag_module)
    dag = getattr(module, args.dag_attr)
    prepare = dag.get_task(f"{args.group}.prepare")
    commit = dag.get_task(f"{args.group}.commit")
    runs = []
    for n in range(1, args.runs + 1):
        prepare.env_vars = (
            {
                # Only the first try of this run's prepare job fails (a Spark driver exit
                # after the staged files are written, before the manifest).
                "EO_FAULT": "{{ 'prepare.after_write' if ti.try_number == 1 else '' }}",
                "EO_FAULT_ACTION": "exit",
            }
            if n in prepare_faults
            else None
        )
        commit._pre_execute_hook = _commit_fault if n in commit_faults else None
        started = time.monotonic()
        dr = dag.test()
        os.environ.pop("EO_FAULT", None)
        os.environ.pop("EO_FAULT_ACTION", None)
        with create_session() as session:
            tis = {
                ti.task_id: {"state": str(ti.state), "try_number": ti.try_number}
                for ti in dr.get_task_instances(session=session)
            }
            rows = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == dag.dag_id,
                    XComModel.run_id == dr.run_id,
                    XComModel.key == "return_value",
                )
            ).all()
            xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows}
        runs.append(
            {
                "run": n,
                "run_id": dr.run_id,
                "state": str(dr.state),
                "tis": tis,
                "xcoms": xcoms,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    print(RESULT_PREFIX + json.dumps(runs, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
