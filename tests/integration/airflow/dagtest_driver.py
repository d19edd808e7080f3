"""Run a DAG with ``dag.test()`` N times in a fresh process (its own AIRFLOW_HOME), with
optional injected faults, and print what happened as one JSON line.

Used by the Airflow integration tests: Airflow reads AIRFLOW_HOME when it is first
imported, so each test drives Airflow from its own process.

    python dagtest_driver.py --dag-module eo_pipeline --runs 3 \
        [--prepare-fault-runs 1] [--commit-fault-runs 2] [--plan-fault-runs 1] \
        [--conf JSON] [--logical-dates ISO,ISO] [--run-after ISO] [--mark-success REGEX]

``--conf`` is each run's conf: ``dag.test(run_conf=...)`` creates the run through
``create_dagrun``, which merges it over the DAG's Params and validates it, as the UI's
Trigger DAG form and ``airflow dags trigger --conf`` do. ``--logical-dates`` gives one
run per date (its data interval is the timetable's for that date). ``--run-after`` fixes the
run's ``run_after``, which names the run (``manual__<run_after>``): two drivers given the same
logical date and run-after run the same DAG run id (the second replaces the first's run, as a
cleared DAG run's next try would).
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


def _plan_fault(context: Any, result: Any) -> None:
    """post_execute hook: fail the first try after the plan task did its work."""
    if context["ti"].try_number == 1:
        raise RuntimeError("injected fault after plan")


def _arm(
    prepare: Any,
    commit: Any,
    plan: Any,
    n: int,
    prepare_faults: set[int],
    commit_faults: set[int],
    plan_faults: set[int],
) -> None:
    """Set (or clear) this run's injected faults on the eo group's tasks."""
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
    plan._post_execute_hook = _plan_fault if n in plan_faults else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dag-module", required=True)
    parser.add_argument("--dag-attr", default="dag")
    parser.add_argument("--group", default="eo")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--prepare-fault-runs", default="")
    parser.add_argument("--commit-fault-runs", default="")
    # A DAG whose commit task is not in an eo group (the stream's commit DAG: "commit").
    parser.add_argument("--commit-task", default=None)
    parser.add_argument("--plan-fault-runs", default="")
    parser.add_argument("--conf", default="")
    parser.add_argument("--logical-dates", default="")
    parser.add_argument("--run-after", default="")
    parser.add_argument("--mark-success", default=None)
    args = parser.parse_args()
    prepare_faults = {int(x) for x in args.prepare_fault_runs.split(",") if x}
    commit_faults = {int(x) for x in args.commit_fault_runs.split(",") if x}
    plan_faults = {int(x) for x in args.plan_fault_runs.split(",") if x}
    run_conf = json.loads(args.conf) if args.conf else None
    from datetime import datetime

    logical_dates = [datetime.fromisoformat(x) for x in args.logical_dates.split(",") if x]
    if logical_dates:
        args.runs = len(logical_dates)

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    module = importlib.import_module(args.dag_module)
    dag = getattr(module, args.dag_attr)
    group = {t.task_id for t in dag.tasks}
    plan = dag.get_task(f"{args.group}.plan") if f"{args.group}.plan" in group else None
    prepare = dag.get_task(f"{args.group}.prepare") if f"{args.group}.prepare" in group else None
    commit_id = args.commit_task or f"{args.group}.commit"
    commit = dag.get_task(commit_id) if commit_id in group else None
    runs = []
    for n in range(1, args.runs + 1):
        if prepare is None or commit is None or plan is None:
            assert not (prepare_faults or plan_faults), "prepare/plan faults need the eo group"
            assert commit is not None or not commit_faults, f"no task {commit_id} for commit faults"
            if commit is not None:
                commit._pre_execute_hook = _commit_fault if n in commit_faults else None
        else:
            _arm(prepare, commit, plan, n, prepare_faults, commit_faults, plan_faults)
        started = time.monotonic()
        test_kwargs: dict[str, Any] = {"run_conf": run_conf, "mark_success_pattern": args.mark_success}
        if logical_dates:
            test_kwargs["logical_date"] = logical_dates[n - 1]
        if args.run_after:
            test_kwargs["run_after"] = datetime.fromisoformat(args.run_after)
        dr = dag.test(**test_kwargs)
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
            # Operator extra links: Airflow stores each one's URL in XCom "_link_<class>".
            link_rows = session.scalars(
                select(XComModel).where(
                    XComModel.dag_id == dag.dag_id,
                    XComModel.run_id == dr.run_id,
                    XComModel.key.startswith("_link_"),
                )
            ).all()
            links = {f"{row.task_id}{row.key}": XComModel.deserialize_value(row) for row in link_rows}
        runs.append(
            {
                "run": n,
                "run_id": dr.run_id,
                "state": str(dr.state),
                "tis": tis,
                "xcoms": xcoms,
                "links": links,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    print(RESULT_PREFIX + json.dumps(runs, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
