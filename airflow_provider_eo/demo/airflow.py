"""``eo demo`` (``--airflow``, the default): the example DAG under real Airflow 3 (``dag.test()``), with one
injected Spark failure that the task retry recovers from.

The Airflow part runs in a child process with its own temporary ``AIRFLOW_HOME`` (SQLite
metadata): Airflow reads its configuration once, at first import, so the parent never
imports Airflow and a developer's own Airflow settings are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_eo.demo.sample import DEMO_TOPIC, seed_demo_topics
from airflow_provider_eo.errors import DemoNeedsCheckout as DemoNeedsCheckout
from airflow_provider_eo.render import (
    FAILED,
    OK,
    console,
    mark,
    print_audit,
    print_checkpoints,
    print_dag_run,
)

RESULT_PREFIX = "EO_AIRFLOW_DEMO_RESULT "
DAG_FILES = ("eo_pipeline.py", "eo_demo_pipelines.py")
RUNS = 3


def dags_source(root: Path | None = None) -> Path:
    """The checkout's ``dags/`` folder holding :data:`DAG_FILES`.

    :param root: the checkout (default: the project root, see ``stack.paths.project_root``).
    :raises DemoNeedsCheckout: when a file is missing (e.g. run from an installed wheel).
    """
    from airflow_provider_eo.stack.paths import project_root

    folder = (root or project_root()) / "dags"
    missing = [name for name in DAG_FILES if not (folder / name).is_file()]
    if missing:
        raise DemoNeedsCheckout(
            f"`eo demo` runs the example DAGs dags/{' and dags/'.join(DAG_FILES)}, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not in {folder}: the "
            "installed package does not ship them, the Airflow demo needs a source checkout of "
            "airflow-provider-eo. Clone the repository and run `make demo` at its root, or run "
            "`eo demo --no-airflow` (the same pipeline without Airflow, no checkout needed)."
        )
    return folder


def _airflow_env(home: Path, dags: Path, checkout: Path, pipeline_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_FAULT"))}
    bin_dir = os.path.dirname(sys.executable)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            # The prepare job's Spark connection: local[2], client mode.
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            # The checkout too: the child, its tasks and the Spark driver run the same
            # package as this process, not another copy installed in the venv.
            "PYTHONPATH": os.pathsep.join([str(dags), str(checkout)]),
            "PYTHONUNBUFFERED": "1",
            **pipeline_env,
        }
    )
    return env


def _child() -> int:
    """In the child: run the example DAG ``RUNS`` times; the first run's first prepare try
    dies after writing its staged files (``EO_FAULT=prepare.after_write``)."""
    import importlib

    module = importlib.import_module("eo_pipeline")
    dag = module.dag
    prepare = dag.get_task("eo.prepare")
    runs: list[dict[str, Any]] = []
    for n in range(1, RUNS + 1):
        prepare.env_vars = (
            {
                "EO_FAULT": "{{ 'prepare.after_write' if ti.try_number == 1 else '' }}",
                "EO_FAULT_ACTION": "exit",
            }
            if n == 1
            else None
        )
        started = time.monotonic()
        dr = dag.test()
        tis = {ti.task_id: [str(ti.state), ti.try_number] for ti in dr.get_task_instances()}
        runs.append(
            {"run_id": dr.run_id, "state": str(dr.state), "tis": tis, "seconds": time.monotonic() - started}
        )
    print(RESULT_PREFIX + json.dumps(runs), flush=True)
    return 0


def run_airflow_demo() -> int:
    """Local Kafka + temporary Airflow home + the example DAG for three checkpoints (one
    injected Spark failure, recovered by the retry); prints the ledger and the audit.
    Stops what it started. Returns 0 when the audit is clean."""
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.ledger import CheckpointState, Ledger
    from airflow_provider_eo.stack.kafka import LocalKafka
    from airflow_provider_eo.stack.paths import state_dir

    started = time.monotonic()
    checkout_dags = dags_source()
    kafka = LocalKafka()
    was_running = kafka.info() is not None
    with console.status("starting the local Kafka broker (KRaft) ..."):
        info = kafka.up()
    console.print(f"{OK} Kafka {info.version} on {info.bootstrap}")
    home = Path(tempfile.mkdtemp(prefix="eo-airflow-demo-"))
    ok = False
    try:
        run = uuid.uuid4().hex[:6]
        source, sink = f"{DEMO_TOPIC}-{run}", f"eo-demo-enriched-{run}"
        committed, aborted = seed_demo_topics(info.bootstrap, source, sink)
        console.print(f"{OK} produced {committed} committed and {aborted} aborted events into {source!r}")
        demo_dir = state_dir() / "airflow-demo" / run
        pipeline_env = {
            "EO_KAFKA_BOOTSTRAP": info.bootstrap,
            "EO_DEMO_PIPELINE": f"airflow-demo-{run}",
            "EO_DEMO_SOURCE_TOPIC": source,
            "EO_DEMO_SINK_TOPIC": sink,
            "EO_LEDGER_URL": f"sqlite:///{demo_dir / 'ledger.db'}",
            "EO_STAGING_DIR": str(demo_dir / "staging"),
            "EO_DEMO_MAX_RECORDS": "25",  # three checkpoints out of the sample
            "EO_RETRY_DELAY_S": "1",
        }
        dags = home / "dags"
        dags.mkdir()
        for name in DAG_FILES:
            shutil.copy(checkout_dags / name, dags / name)
        env = _airflow_env(home, dags, checkout_dags.parent, pipeline_env)
        log_path = home / "airflow-demo.log"
        with (
            console.status("migrating a temporary Airflow metadata database (SQLite) ..."),
            log_path.open("a") as log,
        ):
            subprocess.run(
                [os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=600,
            )
        console.print(f"{OK} Airflow home {home}")
        with (
            console.status(
                f"dag.test() x{RUNS}: plan >> prepare (spark-submit) >> wait >> commit; the first prepare "
                "try is killed on purpose ..."
            ),
            log_path.open("a") as log,
        ):
            proc = subprocess.run(
                [sys.executable, "-m", "airflow_provider_eo.demo.airflow"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                timeout=1800,
                check=False,
            )
            log.write(proc.stdout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if proc.returncode != 0 or not lines:
            tail = log_path.read_text(errors="replace")[-4000:]
            console.print(f"{FAILED} the DAG runs failed (exit {proc.returncode}); log tail:\n{tail}")
            return 1
        for n, r in enumerate(json.loads(lines[-1][len(RESULT_PREFIX) :]), start=1):
            print_dag_run(n, r)
        pipeline = _load_pipeline(dags, pipeline_env)
        with Ledger(pipeline.ledger_url) as ledger:
            checkpoints = ledger.list_checkpoints(pipeline.name)
            print_checkpoints(checkpoints, title=f"checkpoints of {pipeline.name}")
            report = audit_pipeline(pipeline, ledger)
        print_audit(report)
        ok = (
            report.ok
            and len(checkpoints) == RUNS
            and all(c.state is CheckpointState.COMMITTED for c in checkpoints)
        )
        console.print(f"{mark(ok)} Airflow demo  [{time.monotonic() - started:.1f}s]")
        return 0 if ok else 1
    finally:
        if ok:
            shutil.rmtree(home, ignore_errors=True)
        else:
            console.print(f"Airflow home and logs kept in {home}")
        if not was_running:
            kafka.down()
            console.print("broker stopped")


def _load_pipeline(dags: Path, pipeline_env: dict[str, str]) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_eo_demo_pipelines", dags / "eo_demo_pipelines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.demo_pipeline(pipeline_env)


if __name__ == "__main__":
    sys.exit(_child())
