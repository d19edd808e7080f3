"""Airflow integration fixtures: a throwaway AIRFLOW_HOME per test (SQLite metadata
copied from one migrated template), the example DAGs, a fresh pipeline (topics, ledger,
staging) on the session's Kafka broker, and a helper that runs ``dag.test()`` in a
child process (Airflow reads AIRFLOW_HOME once, when it is first imported)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
DRIVER = HERE / "dagtest_driver.py"
RESULT_PREFIX = "EO_RESULT "
# The local Spark connection: master local[2], client mode.
SPARK_CONN = json.dumps({"conn_type": "spark", "host": "local[2]"})


def airflow_base_env(home: Path, dags: Path) -> dict[str, str]:
    """Environment of an Airflow process on ``home`` (nothing inherited from AIRFLOW_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_FAULT"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__API_AUTH__JWT_SECRET": "eo-tests-jwt-secret-not-for-production",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # The sensors wait in the triggerer, as a deployment that turns it on does.
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_CONN,
            # No build tool at task time: a task that would run Maven or javac fails.
            "EO_FORBID_BUILD_TOOLS": "1",
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
            # Spark's Python workers and driver: this venv's interpreter.
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            # ROOT too: the tasks and the Spark driver run this checkout's package, not
            # whichever copy the venv has installed (an editable install of another checkout).
            "PYTHONPATH": os.pathsep.join([str(dags), str(HERE), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata database migrated once per session; tests copy it."""
    home = tmp_path_factory.mktemp("airflow-template")
    dags = home / "dags"
    dags.mkdir()
    proc = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"],
        env=airflow_base_env(home, dags),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return home / "airflow.db"


@dataclass
class AirflowEnv:
    """One test's Airflow home, DAGs folder and pipeline settings."""

    home: Path
    dags: Path
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def pipeline(self) -> Any:
        """The demo Pipeline exactly as the tasks build it from this environment."""
        spec = importlib.util.spec_from_file_location(
            "_eo_demo_pipelines", self.dags / "eo_demo_pipelines.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        keys = {k: v for k, v in self.env.items() if k.startswith("EO_")}
        return module.demo_pipeline(keys)

    def add_dag(self, source: Path) -> None:
        shutil.copy(source, self.dags / source.name)

    def run_dag_test(
        self, dag_module: str, *, runs: int = 1, timeout_s: float = 600, **faults: str
    ) -> list[Any]:
        """Run ``dag.test()`` ``runs`` times in a child process; returns per-run summaries."""
        args = [sys.executable, str(DRIVER), "--dag-module", dag_module, "--runs", str(runs)]
        for name, value in faults.items():
            args += [f"--{name.replace('_', '-')}", value]
        log = self.home / f"dagtest-{len(self.logs) + 1}.log"
        self.logs.append(log)
        with log.open("w") as out:
            # Its own process group: the fixture's teardown stops it if the test did not wait
            # for it (a failed assertion while it runs in a thread).
            proc = subprocess.Popen(
                args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            self.procs.append(proc)
            try:
                proc.wait(timeout=timeout_s)
            finally:
                _kill_group(proc)
        text = log.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)]
        assert proc.returncode == 0 and lines, f"dag.test driver failed ({proc.returncode}):\n{text[-6000:]}"
        result: list[Any] = json.loads(lines[-1][len(RESULT_PREFIX) :])
        return result

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (it leads one) unless it already exited."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _stop_detached_drivers(ledger_url: str) -> None:
    """SIGKILL the session of every detached streaming driver still RUNNING in ``ledger_url``
    (launched by a test that failed before its stream ended): tests leave nothing running."""
    from sqlalchemy import select

    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.ledger.models import StreamRun
    from airflow_provider_eo.processes import pid_alive

    if not Path(ledger_url.removeprefix("sqlite:///")).exists():
        return
    with Ledger(ledger_url) as ledger, ledger._db.read() as s:
        pids = list(
            s.execute(
                select(StreamRun.pid).where(
                    StreamRun.state == "RUNNING", StreamRun.host == socket.gethostname()
                )
            ).scalars()
        )
    for pid in pids:
        if pid <= 1 or not pid_alive(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group > 1 and group != os.getpgrp():  # never this test run's own group
                os.killpg(group, signal.SIGKILL)  # launcher, spark-submit, driver


@pytest.fixture()
def airflow_env(
    tmp_path: Path,
    airflow_db_template: Path,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
) -> Iterator[AirflowEnv]:
    """A fresh AIRFLOW_HOME with the example DAGs and a fresh demo pipeline
    (3-partition source and sink topics, SQLite ledger, staging folder). On teardown, any
    dag.test still running and any detached streaming driver still registered are stopped."""
    home = tmp_path / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True)
    shutil.copy(airflow_db_template, home / "airflow.db")
    for name in ("eo_pipeline.py", "eo_demo_pipelines.py"):
        shutil.copy(ROOT / "dags" / name, dags / name)
    env = airflow_base_env(home, dags)
    env.update(
        {
            "EO_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "EO_DEMO_PIPELINE": f"af-{uuid.uuid4().hex[:8]}",
            "EO_DEMO_SOURCE_TOPIC": make_topic("af-src", 3),
            "EO_DEMO_SINK_TOPIC": make_topic("af-sink", 3),
            "EO_LEDGER_URL": f"sqlite:///{tmp_path}/ledger.db",
            "EO_STAGING_DIR": str(tmp_path / "staging"),
            "EO_DEMO_MAX_RECORDS": "25",
            "EO_RETRY_DELAY_S": "1",
        }
    )
    airflow = AirflowEnv(home=home, dags=dags, env=env)
    try:
        yield airflow
    finally:
        for proc in airflow.procs:
            _kill_group(proc)
        _stop_detached_drivers(env["EO_LEDGER_URL"])
