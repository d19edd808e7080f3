"""Install the provider as a team would: the built wheel into a clean virtualenv next to an
existing Airflow, nothing of this checkout on the path.

Three Airflows, one virtualenv each (made once for this module, with uv and its cache):

- the lowest Airflow the wheel declares (``apache-airflow>=3.1.0``): ``3.1.0``, with the
  Airflow providers the wheel requires at their declared lower bounds, and Airflow 3.1.0's
  own dependencies as that release needs them (``constraints-airflow-3.1.0.txt``);
- the newest 3.2 and the newest 3.3 the resolver picks (``apache-airflow>=3.2,<3.3``,
  ``>=3.3,<3.4``, nothing pinned; 3.3 is what the rest of the test suite runs).

In each, Airflow lists the provider, every module the provider info advertises imports,
the example DAGs parse without errors, and no full ``pyspark`` is pulled in (it is the
``spark`` extra; the Spark provider brings only ``pyspark-client``). The wheel carries its
package data (migrations, Maven poms, Java sources, log4j config). In the lowest
Airflow's virtualenv, with the ``spark`` extra added, the example pipeline DAG
(``dags/eo_pipeline.py``) runs under ``dag.test()`` against the session's Kafka broker and
its sink holds every committed source record exactly once; and the Exactly-once page answers
in its api-server to a user's token and login cookie, and to no one else.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from email.parser import Parser
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.provider_info import get_provider_info

pytestmark = [pytest.mark.install, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
UV = str(VENV_BIN / "uv")
DAGTEST_DRIVER = ROOT / "tests" / "integration" / "airflow" / "dagtest_driver.py"
RESULT_PREFIX = "EO_RESULT "

#: The lowest Airflow the wheel declares (pyproject.toml), installed as it was released:
#: FLOOR_CONSTRAINTS holds the versions of Airflow's own dependencies that release needs
#: and no longer gets from an unconstrained resolve.
FLOOR_AIRFLOW = "3.1.0"
FLOOR_CONSTRAINTS = HERE / f"constraints-airflow-{FLOOR_AIRFLOW}.txt"
#: The minors above the floor: the resolver picks the patch.
MINORS = {"3.2": "apache-airflow>=3.2,<3.3", "3.3": "apache-airflow>=3.3,<3.4"}


def _run(
    cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 900
) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)
    shown = " ".join(cmd)
    shown = shown if len(shown) < 400 else shown[:400] + " ..."
    assert proc.returncode == 0, (
        f"{shown} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def _advertised_modules() -> list[str]:
    info = get_provider_info()
    modules = [
        m for section in ("hooks", "operators", "sensors") for e in info[section] for m in e["python-modules"]
    ]
    modules += [m for e in info["triggers"] for m in e["python-modules"]]
    modules += [info["extra-links"][0].rsplit(".", 1)[0], "airflow_provider_eo.ui.plugin"]
    return modules


# What Airflow sees in a virtualenv: the installed package, the advertised modules importable,
# the example DAGs parsed as the dag-processor parses a dags-folder bundle (its folder on
# sys.path), and whether a full pyspark is installed.
PROBE = """
import importlib, json, sys
from importlib.metadata import version, PackageNotFoundError
from pathlib import Path
import airflow_provider_eo
for m in {modules!r}:
    importlib.import_module(m)
dags = Path({dags!r})
try:  # Airflow >= 3.2
    from airflow.dag_processing.dagbag import BundleDagBag
except ImportError:
    try:
        from airflow.models.dagbag import BundleDagBag
    except ImportError:  # Airflow 3.1.0
        BundleDagBag = None
if BundleDagBag is not None:
    bag = BundleDagBag(dags, bundle_path=dags)
else:
    from airflow.models.dagbag import DagBag
    sys.path.insert(0, str(dags))
    bag = DagBag(str(dags), include_examples=False)
try:
    full_pyspark = version("pyspark")
except PackageNotFoundError:
    full_pyspark = None
from importlib.metadata import distributions
providers = {{d.metadata["Name"]: d.version for d in distributions()
    if d.metadata["Name"].startswith("apache-airflow-providers-")}}
print(json.dumps({{"file": airflow_provider_eo.__file__, "airflow": version("apache-airflow"),
    "errors": {{k: str(v)[-500:] for k, v in bag.import_errors.items()}}, "dags": sorted(bag.dag_ids),
    "pyspark": full_pyspark, "providers": providers}}))
"""


@dataclass
class AirflowVenv:
    """A clean virtualenv with the wheel next to one Airflow; ``facts`` is what the probe saw
    right after the install (before any extra was added)."""

    path: Path
    wheel: Path
    requirements: list[str]
    constraints: list[str]
    env: dict[str, str]
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def install(self, *specs: str, cached_first: bool = False) -> None:
        """``uv pip install`` into this virtualenv (uv's cache makes a repeat cheap).

        ``cached_first``: from uv's cache alone when it holds everything (``--offline``),
        else from the registry. For pyspark, an sdist: uv revalidates it with the registry on
        every install and, told it changed, builds it again (~30 s); offline it takes the
        wheel it built last time.
        """
        cmd = [UV, "pip", "install", "-q", "--python", self.python, *self.constraints, *specs]
        if cached_first:
            offline = subprocess.run(
                [*cmd, "--offline", *self.requirements], capture_output=True, env=self.env, timeout=900
            )
            if offline.returncode == 0:
                return
        _run(cmd + self.requirements, env=self.env)

    def run(self, *args: str, timeout: float = 900) -> str:
        return _run(
            [str(self.path / "bin" / args[0]), *args[1:]], env=self.env, cwd=self.path, timeout=timeout
        )


def _venv_env(home: Path, venv: Path, dags: Path) -> dict[str, str]:
    # Nothing of this checkout (tests/conftest.py puts it on PYTHONPATH for Spark workers).
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "EO_", "VIRTUAL_ENV"))
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),  # Airflow puts it on sys.path, as deployed
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PATH=f"{venv / 'bin'}:{env['PATH']}",
    )
    return env


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(meta_name).decode())


def _declared_provider_floors(wheel: Path) -> list[str]:
    """The Airflow providers the wheel requires, each at the lower bound it declares."""
    floors = []
    for req in _metadata(wheel).get_all("Requires-Dist") or []:
        name, sep, lowest = req.partition(">=")
        if name.startswith("apache-airflow-providers-") and sep and "," not in lowest and ";" not in lowest:
            floors.append(f"{name}=={lowest}")
    return floors


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The provider's wheel, built once."""
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)])
    (built,) = dist.glob("airflow_provider_eo-*.whl")
    return built


@pytest.fixture(scope="module")
def airflow_venvs(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Callable[[str], AirflowVenv]:
    """``airflow_venvs("floor" | "3.2" | "3.3")``: that Airflow's virtualenv, made on first use.

    The floor: the lowest Airflow with the lowest Airflow providers the wheel declares (the
    Spark and Kafka providers); a minor: whatever the resolver picks for it.
    """
    made: dict[str, AirflowVenv] = {}
    specs = {
        "floor": (
            [f"apache-airflow=={FLOOR_AIRFLOW}", *_declared_provider_floors(wheel)],
            ["-c", str(FLOOR_CONSTRAINTS)],
        ),
        **{minor: ([spec], []) for minor, spec in MINORS.items()},
    }

    def get(which: str) -> AirflowVenv:
        if which in made:
            return made[which]
        base = tmp_path_factory.mktemp(f"airflow-{which}")
        path, home = base / "venv", base / "airflow-home"
        home.mkdir()
        requirements, constraints = specs[which]
        venv = AirflowVenv(path, wheel, requirements, constraints, _venv_env(home, path, ROOT / "dags"))
        started = time.monotonic()
        _run([UV, "venv", "-q", str(path), "--python", sys.executable])
        venv.install(str(wheel))
        venv.seconds["install"] = round(time.monotonic() - started, 1)
        probe = PROBE.format(modules=_advertised_modules(), dags=str(ROOT / "dags"))
        venv.facts = json.loads(venv.run("python", "-c", probe).strip().splitlines()[-1])
        made[which] = venv
        return venv

    return get


def test_wheel_carries_its_package_data_and_declares_no_pyspark(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    metadata = _metadata(wheel)
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
    assert f"apache-airflow>={FLOOR_AIRFLOW}" in core and not any(r.startswith("pyspark") for r in core), core
    assert any(r.startswith("apache-airflow-providers-apache-kafka") for r in core), core


@pytest.mark.parametrize("which", ["floor", *MINORS])
def test_wheel_installs_into_a_clean_virtualenv_next_to_airflow(
    which: str, airflow_venvs: Callable[[str], AirflowVenv]
) -> None:
    venv = airflow_venvs(which)
    facts = venv.facts
    assert facts["file"].startswith(str(venv.path)), facts  # the installed wheel, not the checkout
    if which == "floor":
        assert facts["airflow"] == FLOOR_AIRFLOW, facts
        for floor in _declared_provider_floors(venv.wheel):
            name, _, lowest = floor.partition("==")
            assert facts["providers"][name] == lowest, facts
    else:
        assert facts["airflow"].startswith(f"{which}."), facts
    assert facts["errors"] == {}, facts
    assert {"eo_pipeline", "eo_savepoint", "eo_backfill", "eo_stream", "eo_control"} <= set(facts["dags"]), (
        facts
    )
    assert facts["pyspark"] is None, facts  # full pyspark only with the `spark` extra

    listed = json.loads(venv.run("airflow", "providers", "list", "-o", "json").strip().splitlines()[-1])
    ours = [p for p in listed if p["package_name"] == "airflow-provider-eo"]
    assert ours and ours[0]["version"] == _metadata(venv.wheel)["Version"], listed
    assert any(p["package_name"] == "apache-airflow-providers-apache-kafka" for p in listed), listed
    print(
        f"{which}: Airflow {facts['airflow']}, {facts['providers']}, installed in {venv.seconds['install']} s"
    )


# -- The example pipeline DAG on the lowest Airflow ------------------------------------------
def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _demo_pipeline(env: dict[str, str]) -> Any:
    """The demo Pipeline as the DAG's tasks build it from ``env``."""
    spec = importlib.util.spec_from_file_location(
        "_eo_install_demo_pipelines", ROOT / "dags" / "eo_demo_pipelines.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.demo_pipeline({k: v for k, v in env.items() if k.startswith("EO_")})


@pytest.fixture()
def floor_spark_airflow(
    airflow_venvs: Callable[[str], AirflowVenv], tmp_path: Path
) -> Iterator[tuple[AirflowVenv, dict[str, str]]]:
    """The lowest Airflow's virtualenv with the ``spark`` extra, a migrated metadata database
    and the example pipeline DAG in a DAGs folder of its own; the environment to run it in."""
    venv = airflow_venvs("floor")
    started = time.monotonic()
    # The Spark this checkout's bootstrap fetched the Kafka connector for (the jars under .eo);
    # pyspark and the Spark provider's pyspark-client install one module: one version for both.
    spark = version("pyspark")
    venv.install(f"{venv.wheel}[spark]", f"pyspark=={spark}", f"pyspark-client=={spark}", cached_first=True)
    venv.seconds["spark"] = round(time.monotonic() - started, 1)
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    for name in ("eo_pipeline.py", "eo_demo_pipelines.py"):
        shutil.copy(ROOT / "dags" / name, dags / name)
    env = _venv_env(home, venv.path, dags)
    env.update(
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        # The sensor is deferrable, as in the other Airflow tests ([operators] default_deferrable).
        AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="True",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        # The connector and partitioner jars `eo setup jars` (here: scripts/bootstrap.sh) cached.
        EO_HOME=str(ROOT / ".eo"),
        EO_FORBID_BUILD_TOOLS="1",
        PYSPARK_PYTHON=venv.python,
        PYSPARK_DRIVER_PYTHON=venv.python,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=str(dags),  # the DAGs folder only: the installed wheel, not the checkout
        PYTHONUNBUFFERED="1",
    )
    started = time.monotonic()
    airflow = str(venv.path / "bin" / "airflow")
    _run([airflow, "db", "migrate"], env=env, cwd=tmp_path, timeout=300)
    # As the dag-processor would: Airflow 3.1.0's dag.test() needs the DAG serialized first
    # (later 3.1 patches serialize it themselves).
    _run([airflow, "dags", "reserialize"], env=env, cwd=tmp_path, timeout=300)
    venv.seconds["db_migrate"] = round(time.monotonic() - started, 1)
    yield venv, env


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.airflow
def test_pipeline_dag_runs_exactly_once_on_the_lowest_airflow(
    floor_spark_airflow: tuple[AirflowVenv, dict[str, str]],
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """One ``dag.test()`` run of ``eo_pipeline`` (plan, spark-submit prepare, sensor,
    commit) on the lowest Airflow: every committed source record in the sink once,
    none of the aborted transaction's, nothing else."""
    from eo_source_sink import assert_sink_is_source_exactly_once

    from airflow_provider_eo.demo.sample import produce_sample

    venv, env = floor_spark_airflow
    env = dict(env)
    env.update(
        EO_KAFKA_BOOTSTRAP=kafka_bootstrap,
        EO_DEMO_PIPELINE=f"install-{uuid.uuid4().hex[:8]}",
        EO_DEMO_SOURCE_TOPIC=make_topic("install-src", 3),
        EO_DEMO_SINK_TOPIC=make_topic("install-sink", 3),
        EO_LEDGER_URL=f"sqlite:///{tmp_path}/ledger.db",
        EO_STAGING_DIR=str(tmp_path / "staging"),
        EO_DEMO_MAX_RECORDS="1000",  # one checkpoint takes the whole sample
        EO_RETRY_DELAY_S="1",
    )
    pipeline = _demo_pipeline(env)
    committed, aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    log = tmp_path / "dagtest.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [venv.python, str(DAGTEST_DRIVER), "--dag-module", "eo_pipeline", "--runs", "1"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=600)
        finally:
            _kill_group(proc)
    seconds = round(time.monotonic() - started, 1)
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert proc.returncode == 0 and lines, f"dag.test on Airflow {FLOOR_AIRFLOW} failed:\n{text[-6000:]}"
    (run,) = json.loads(lines[-1][len(RESULT_PREFIX) :])

    assert run["state"] == "success", run
    assert all(ti["try_number"] == 1 for ti in run["tis"].values()), run
    assert run["xcoms"]["eo.commit"]["state"] == "COMMITTED", run
    # The prepare task spark-submitted the installed wheel's application, not this checkout's.
    installed_app = re.escape(str(venv.path)) + r"/lib/python[\d.]+/site-packages/airflow_provider_eo/apps/"
    assert re.search(installed_app + r"prepare\.py", text), text[-6000:]
    assert f"{ROOT}/airflow_provider_eo" not in text, text[-6000:]
    # Counted against the source: each committed input once in the sink, nothing else there.
    report = assert_sink_is_source_exactly_once(pipeline.kafka, pipeline, source_records=committed)
    assert report.sink == committed == 40 and aborted == 20, report.describe()
    print(
        f"Airflow {FLOOR_AIRFLOW}: spark extra {venv.seconds['spark']} s, db migrate "
        f"{venv.seconds['db_migrate']} s, dag.test {seconds} s"
    )


# -- The Exactly-once page on the lowest Airflow ---------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.airflow
def test_exactly_once_page_authenticates_on_the_lowest_airflow(
    airflow_venvs: Callable[[str], AirflowVenv], tmp_path: Path
) -> None:
    """The page's API in the lowest Airflow's api-server (the plugin the wheel registers):
    a user's bearer token and the UI's login cookie both read it; no credential, 401; a
    forged cookie, 403. Airflow 3.1.0 resolves users differently from later versions."""
    import httpx
    from eo_harness import wait_for

    from airflow_provider_eo.ledger import Ledger

    venv = airflow_venvs("floor")
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": "admin-pw-eo"}))
    ledger_url = f"sqlite:///{tmp_path}/ledger.db"
    pipeline = f"install-ui-{uuid.uuid4().hex[:6]}"
    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline, "fingerprint")
    port = _free_port()
    env = _venv_env(home, venv.path, dags)
    env.update(
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API_AUTH__JWT_SECRET="eo-install-tests-jwt-secret-not-for-production",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
        EO_LEDGER_URL=ledger_url,
    )
    airflow = str(venv.path / "bin" / "airflow")
    _run([airflow, "db", "migrate"], env=env, cwd=tmp_path, timeout=300)
    log = tmp_path / "api-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [airflow, "api-server"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, f"api-server exited:\n{log.read_text(errors='replace')[-5000:]}"
            try:
                return httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, f"Airflow {FLOOR_AIRFLOW}'s api-server to answer /api/v2/monitor/health")
        login = httpx.post(
            f"{url}/auth/token", json={"username": "admin", "password": "admin-pw-eo"}, timeout=30
        )
        assert login.status_code in (200, 201), login.text
        token = login.json()["access_token"]
        page = f"{url}/eo/api/pipelines"
        by_bearer = httpx.get(page, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        by_cookie = httpx.get(page, cookies={"_token": token}, timeout=30)
        anonymous = httpx.get(page, timeout=30)
        forged = httpx.get(page, cookies={"_token": token[:-4] + "AAAA"}, timeout=30)
    finally:
        _kill_group(proc)
    server_log = log.read_text(errors="replace")[-5000:]
    for response in (by_bearer, by_cookie):
        assert response.status_code == 200, (response.status_code, response.text, server_log)
        assert pipeline in [p["name"] for p in response.json()["pipelines"]], response.text
    assert anonymous.status_code == 401, (anonymous.status_code, anonymous.text)
    assert forged.status_code == 403, (forged.status_code, forged.text)
