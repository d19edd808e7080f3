"""Install the provider as a team would: the built wheel into a clean virtualenv next to the
lowest Airflow it declares (``apache-airflow>=3.3.0``), nothing of this checkout on the path.

Airflow lists the provider, every module the provider info advertises imports, the
example DAGs parse without errors, the package data (migrations, Maven poms, Java
sources, log4j config) is in the wheel, and no full ``pyspark`` is pulled in (it is the
``spark`` extra; the Spark provider brings only ``pyspark-client``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from airflow_provider_eo.provider_info import get_provider_info

pytestmark = [pytest.mark.install, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
LOWEST_AIRFLOW = "3.3.0"


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900, check=False)
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def _advertised_modules() -> list[str]:
    info = get_provider_info()
    modules = [
        m for section in ("hooks", "operators", "sensors") for e in info[section] for m in e["python-modules"]
    ]
    modules += [m for e in info["triggers"] for m in e["python-modules"]]
    return modules


def test_wheel_installs_into_a_clean_virtualenv_next_to_the_lowest_airflow(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)])
    (wheel,) = dist.glob("airflow_provider_eo-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(zf.read(meta_name).decode())
    for data in (
        "airflow_provider_eo/py.typed",
        "airflow_provider_eo/ledger/migrations/env.py",
        "airflow_provider_eo/stack/log4j2.properties",
    ):
        assert data in names, data
    assert any(n.startswith("airflow_provider_eo/ledger/migrations/versions/0003_") for n in names)
    assert any(n.endswith("/pom.xml") for n in names) and any(n.endswith(".java") for n in names)
    requires = metadata.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert "apache-airflow>=3.3.0" in core and not any(r.startswith("pyspark") for r in core), core
    assert any(r.startswith("apache-airflow-providers-apache-kafka") for r in core), core

    venv = tmp_path / "venv"
    _run([str(VENV_BIN / "uv"), "venv", "-q", str(venv), "--python", sys.executable])
    python = venv / "bin" / "python"
    _run(
        [
            str(VENV_BIN / "uv"),
            "pip",
            "install",
            "-q",
            "--python",
            str(python),
            str(wheel),
            f"apache-airflow=={LOWEST_AIRFLOW}",
        ]
    )

    # Nothing of this checkout (tests/conftest.py puts it on PYTHONPATH for Spark workers).
    home = tmp_path / "airflow-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "EO_"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),  # Airflow puts it on sys.path, as deployed
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PATH=f"{venv / 'bin'}:{env['PATH']}",
    )
    probe = f"""
import importlib, json
from importlib.metadata import version, PackageNotFoundError
import airflow_provider_eo
for m in {_advertised_modules()!r}:
    importlib.import_module(m)
from pathlib import Path
from airflow.dag_processing import dagbag
# As the dag-processor parses a dags-folder bundle: the bundle's folder on sys.path.
dags = Path({str(ROOT / "dags")!r})
bag = dagbag.BundleDagBag(dags, bundle_path=dags)
try:
    full_pyspark = version("pyspark")
except PackageNotFoundError:
    full_pyspark = None
print(json.dumps({{"file": airflow_provider_eo.__file__, "airflow": version("apache-airflow"),
    "errors": {{k: str(v)[-500:] for k, v in bag.import_errors.items()}}, "dags": sorted(bag.dag_ids),
    "pyspark": full_pyspark}}))
"""
    facts = json.loads(_run([str(python), "-c", probe], env=env, cwd=tmp_path).strip().splitlines()[-1])
    assert facts["file"].startswith(str(venv)), facts  # the installed wheel, not the checkout
    assert facts["airflow"] == LOWEST_AIRFLOW and facts["errors"] == {}, facts
    assert {"eo_pipeline", "eo_savepoint", "eo_backfill", "eo_stream"} <= set(facts["dags"]), facts
    assert facts["pyspark"] is None, facts  # full pyspark only with the `spark` extra

    listed = json.loads(
        _run([str(venv / "bin" / "airflow"), "providers", "list", "-o", "json"], env=env, cwd=tmp_path)
    )
    ours = [p for p in listed if p["package_name"] == "airflow-provider-eo"]
    assert ours and ours[0]["version"] == metadata["Version"], listed
    assert any(p["package_name"] == "apache-airflow-providers-apache-kafka" for p in listed), listed
