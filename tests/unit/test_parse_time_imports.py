"""What a DAG file imports stays light: the task group, every operator, sensor and trigger
module load none of confluent_kafka, pyarrow, alembic, pyspark or pandas (they are imported
when a task runs). Checked in a fresh process; bench/dag_parse.py measures the time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow_provider_eo

HEAVY = ("confluent_kafka", "pyarrow", "alembic", "pyspark", "pandas")
# eo's OpenLineage facet is built when a task runs, never while a DAG file is parsed.
HEAVY_EO = ("airflow_provider_eo.openlineage.facets",)
PACKAGE = Path(airflow_provider_eo.__file__).parent


def test_dag_facing_modules_import_no_heavy_library(tmp_path: Path) -> None:
    modules = ["airflow_provider_eo.task_group"] + [
        f"airflow_provider_eo.{section}.{f.stem}"
        for section in ("operators", "sensors", "triggers")
        for f in sorted((PACKAGE / section).glob("*.py"))
        if f.stem != "__init__"
    ]
    probe = (
        "import importlib, json, sys\n"
        "import airflow.sdk\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY + HEAVY_EO!r} if m in sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], out.stdout
