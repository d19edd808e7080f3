"""The example DAGs import with zero errors in the docker/ stack's own Airflow environment
(its EO_* settings and AIRFLOW_CONN_* connections), parsed as its dag-processor does. The
stack's ledger is an Airflow connection: no DAG and no trigger gets a URL with a password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from pathlib import Path
from airflow.dag_processing import dagbag
dags = Path(sys.argv[1])
bag = dagbag.BundleDagBag(dags, bundle_path=dags)
print(json.dumps({"errors": {k: str(v)[-800:] for k, v in bag.import_errors.items()},
                  "dags": sorted(bag.dag_ids)}))
"""


def _compose_airflow_env() -> dict[str, str]:
    doc = yaml.safe_load((ROOT / "docker" / "docker-compose.yml").read_text())
    return {k: str(v) for k, v in doc["x-airflow"]["environment"].items()}


def test_example_dags_import_with_the_compose_environment(tmp_path: Path) -> None:
    compose = _compose_airflow_env()
    assert "EO_LEDGER_URL" not in compose  # the ledger comes from its connection
    assert compose["EO_LEDGER_CONN_ID"] in {k.removeprefix("AIRFLOW_CONN_").lower() for k in compose}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_"))}
    env.update(compose)
    env.update(  # this machine instead of the containers: the same settings, local paths
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/airflow.db",
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(tmp_path / "passwords.json"),
        EO_STAGING_DIR=str(tmp_path / "staging"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "dags")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["errors"] == {}, facts["errors"]
    assert {"eo_pipeline", "eo_savepoint", "eo_backfill", "eo_stream", "eo_control"} <= set(facts["dags"]), (
        facts
    )


def test_ledger_upgrade_takes_the_ledger_from_an_airflow_connection(tmp_path: Path) -> None:
    """The stack's init step: `eo ledger upgrade --conn-id eo_ledger_default`."""
    db = tmp_path / "ledger.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_"))}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW_CONN_EO_LEDGER_DEFAULT=json.dumps({"conn_type": "eo_ledger", "host": str(db)}),
        COLUMNS="500",  # one line per message
    )
    eo = str(Path(sys.executable).with_name("eo"))
    proc = subprocess.run(
        [eo, "ledger", "upgrade", "--conn-id", "eo_ledger_default"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"ledger at sqlite:///{db}: schema empty -> " in proc.stderr, proc.stderr
    assert db.is_file()
