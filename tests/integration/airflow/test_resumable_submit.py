"""Durable spark-submit of the backfill's prepares on a Spark standalone master in cluster
deploy mode, under ``dag.test()``: Airflow 3.3's own ``task_state_store`` (the metadata
database, through the execution API), the Spark provider's own resumable path (the driver
id stored before polling, driver status over the master's REST API), real drivers on the
cluster's worker, real Kafka and ledger.

One backfill of two checkpoints, whose first try dies while its first driver runs (an error
raised in the provider's polling, after the id was stored: the worker lost mid-job, as far as
the store and the cluster are concerned). That driver waits at ``prepare.before_ledger``
until the test lets it go on. The retry

- re-attaches to the first checkpoint's driver, still running, and submits nothing for it;
- then, in the same try, submits the second checkpoint's driver while the store holds the
  first one's FINISHED driver (with one key per task, the Spark provider would take that
  driver for the second checkpoint's and submit nothing);

and ends with one driver per checkpoint, each id under the checkpoint's own key, both
checkpoints COMMITTED, and every committed source record once in the backfill sink.

The live pipeline's history is recorded in the ledger through its own transitions (one
COMMITTED checkpoint over the whole source) instead of being run: the backfill reads only
the source and the ledger, never the live sink. Every case of the decision the drivers go
through (ended, unknown, another checkpoint's, no store) is in
tests/unit/operators/test_resume.py, against a fake cluster.

Spark refuses cluster deploy mode for Python applications on a standalone master
("Cluster deploy mode is currently not supported for python applications on standalone
clusters"). So the tests' ``spark-submit`` (first on the tasks' PATH, :data:`LAUNCHER`)
submits a cluster-mode Python application as YARN's cluster mode runs one: the driver runs
``org.apache.spark.deploy.PythonRunner`` with the ``.py`` file and the ``--py-files``.
That is the only difference from a real cluster submission; the operators, the Spark
provider, its hook and Airflow are unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import poll_until
from eo_source_sink import compare_source_and_sink
from eo_spark_standalone import StandaloneCluster

from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import settled_ends
from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec

from .conftest import DRIVER, RESULT_PREFIX, VENV_BIN, AirflowEnv, _kill_group

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.timeout(600),
]

#: Offsets per backfill checkpoint: the sample's 69 source offsets (60 records, 20 of them
#: aborted, and the transaction markers) make two.
BACKFILL_MAX_RECORDS = "40"

LAUNCHER = '''#!{python}
"""spark-submit for the tests' standalone master: a Python application in cluster deploy
mode is submitted as a JVM driver running org.apache.spark.deploy.PythonRunner (what
YARN's cluster mode does), because Spark refuses Python in standalone cluster mode.
Anything else goes to spark-submit unchanged."""
import os
import sys

REAL = {real!r}
JAR = {jar!r}
FLAGS = {{"--verbose", "-v", "--supervise"}}

args = sys.argv[1:]
mode = args[args.index("--deploy-mode") + 1] if "--deploy-mode" in args else "client"
if mode == "cluster" and "--status" not in args and "--kill" not in args:
    i, opts, py_files = 0, [], ""
    while i < len(args) and args[i].startswith("-"):
        if args[i] in FLAGS:
            opts.append(args[i])
            i += 1
            continue
        if args[i] == "--py-files":
            py_files = args[i + 1]
        opts += args[i : i + 2]
        i += 2
    if i < len(args) and args[i].endswith(".py"):
        runner = ["--class", "org.apache.spark.deploy.PythonRunner", JAR]
        args = [*opts, *runner, args[i], py_files, *args[i + 1 :]]
os.execv(REAL, [REAL, *args])
'''

DAGS = '''
"""The backfill on the standalone master in cluster deploy mode; its first try dies while
it polls its first driver."""
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_eo.operators.backfill import EoBackfillOperator


class DiesWhilePolling(EoBackfillOperator):
    """The first try raises while the Spark provider polls its first driver, after the
    driver's id was stored: the driver keeps running on the cluster."""

    def poll_until_complete(self, external_id, context):
        if context["ti"].try_number == 1:
            raise RuntimeError(f"injected: the task dies while polling driver {external_id}")
        return super().poll_until_complete(external_id, context)


with DAG(dag_id="eo_resume_backfill", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    DiesWhilePolling(
        task_id="backfill",
        pipeline="eo_demo_pipelines:demo_pipeline",
        sink_topic=os.environ.get("EO_BACKFILL_SINK_TOPIC", "unset"),
        start=0,
        end=4102444800000,  # 2100-01-01
        conn_id="spark_cluster",
        jars=os.environ.get("EO_SPARK_JARS"),
        conf={"spark.ui.enabled": "false"},
        driver_memory="512m",
        executor_memory="512m",
        executor_cores=1,
        total_executor_cores=1,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
'''


class RestCluster(StandaloneCluster):
    """The standalone master with its REST server on (the Spark provider reads driver
    states from it) on a free port."""

    EXTRA_PORTS = 1

    def __init__(self, home: Path) -> None:
        super().__init__(home, cores=2, memory="1g")

    @property
    def rest_port(self) -> int:
        """The master's REST submission server's port."""
        return self.extra_ports[0]

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["SPARK_MASTER_OPTS"] = (
            f"-Dspark.master.rest.enabled=true -Dspark.master.rest.port={self.rest_port}"
        )
        return env

    def drivers(self) -> list[dict[str, Any]]:
        """Every driver the master knows (running and completed)."""
        state = self.state()
        return [*state.get("activedrivers", []), *state.get("completeddrivers", [])]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCluster]:
    standalone = RestCluster(tmp_path_factory.mktemp("spark-rest"))
    standalone.up()
    try:
        yield standalone
    finally:
        standalone.down()


@pytest.fixture()
def on_cluster(
    airflow_env: AirflowEnv, cluster: RestCluster, tmp_path: Path, make_topic: Callable[..., str]
) -> Any:
    """The test's Airflow: ``spark_default`` local (the live pipeline), ``spark_cluster`` the
    standalone master in cluster deploy mode, the launcher first on PATH, the backfill DAGs."""
    from airflow_provider_eo.stack.maven import spark_kafka_jars

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    jar = tmp_path / "python-runner.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    launcher = bin_dir / "spark-submit"
    launcher.write_text(
        LAUNCHER.format(python=sys.executable, real=str(VENV_BIN / "spark-submit"), jar=str(jar))
    )
    launcher.chmod(0o755)
    (airflow_env.dags / "eo_resume_dags.py").write_text(DAGS)
    host, port = cluster.master_url.rsplit(":", 1)
    airflow_env.env.update(
        {
            "PATH": os.pathsep.join([str(bin_dir), airflow_env.env["PATH"]]),
            "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps(
                {
                    "conn_type": "spark",
                    "host": host,
                    "port": int(port),
                    "extra": {"deploy-mode": "cluster", "rest-port": cluster.rest_port},
                }
            ),
            "EO_SPARK_JARS": ",".join(str(p) for p in spark_kafka_jars()),
            "EO_BACKFILL_SINK_TOPIC": make_topic("af-backfill", 3),
        }
    )
    return airflow_env


def _live_committed(airflow_env: AirflowEnv, kafka_bootstrap: str) -> tuple[Any, int]:
    """The sample in the source, and the live pipeline's one COMMITTED checkpoint over all
    of it recorded in the ledger (plan, prepared, committed: what a live run leaves there
    for a backfill). Returns the pipeline and the source's committed records."""
    airflow_env.env["EO_DEMO_MAX_RECORDS"] = BACKFILL_MAX_RECORDS
    pipeline = airflow_env.pipeline()
    topic = pipeline.source_topics[0]
    committed, _aborted = produce_sample(kafka_bootstrap, topic)
    partitions = [(topic, p) for p in admin.partitions_of(pipeline.kafka, [topic])[topic]]
    ends = settled_ends(pipeline.kafka, partitions)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        cp = ledger.plan(pipeline.name, [RangeSpec(t, p, 0, end) for (t, p), end in ends.items()])
        ledger.mark_prepared(
            pipeline.name,
            cp.checkpoint_id,
            attempt="live",
            staging_location="unused",
            records=committed,
            bytes_=0,
            shard_counts={0: committed},
        )
        ledger.mark_committed(pipeline.name, cp.checkpoint_id)
    return pipeline, committed


def _stored(airflow_env: AirflowEnv) -> dict[str, Any]:
    """The backfill task's task_state_store rows, from Airflow's metadata database."""
    with contextlib.closing(sqlite3.connect(airflow_env.home / "airflow.db")) as db:
        rows = db.execute(
            "SELECT key, value FROM task_state_store WHERE dag_id = 'eo_resume_backfill' "
            "AND task_id = 'backfill'"
        ).fetchall()
    return {key: json.loads(value) for key, value in rows}


def _backfill_done(airflow_env: AirflowEnv, run: dict[str, Any], committed: int) -> tuple[str, list[Any]]:
    """The backfill's checkpoints, all COMMITTED, and its sink exactly the source's
    committed records, once each."""
    out = run["xcoms"]["backfill"]
    name = out["backfill_pipeline"]
    pipeline = airflow_env.pipeline()
    with Ledger(pipeline.ledger_url) as ledger:
        checkpoints = ledger.list_checkpoints(name)
    assert checkpoints and all(c.state is CheckpointState.COMMITTED for c in checkpoints), checkpoints
    assert out["records"] == committed, out
    report = compare_source_and_sink(
        pipeline.kafka, list(pipeline.source_topics), airflow_env.env["EO_BACKFILL_SINK_TOPIC"], name
    )
    assert report.exactly_once and report.source == committed, report.describe()
    return name, checkpoints


def _our_processes(airflow_env: AirflowEnv, *, stopped: bool = False) -> list[int]:
    """This user's processes started for this test's pipeline (their environment names it),
    only the stopped ones (SIGSTOP) with ``stopped``."""
    needle = f"EO_DEMO_PIPELINE={airflow_env.env['EO_DEMO_PIPELINE']}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and (state == "T" or not stopped):
                    found.append(int(entry.name))
    return found


def _release_stopped(airflow_env: AirflowEnv) -> None:
    for pid in _our_processes(airflow_env, stopped=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_retry_reattaches_to_its_running_driver_then_submits_the_next_checkpoint(
    on_cluster: AirflowEnv, kafka_bootstrap: str, cluster: RestCluster, tmp_path: Path
) -> None:
    pipeline, committed = _live_committed(on_cluster, kafka_bootstrap)
    before = {d["id"] for d in cluster.drivers()}
    # The first prepare driver to get there stops before it records PREPARED, and goes on
    # when the test sends SIGCONT (the drivers inherit the task's environment).
    env = {
        **on_cluster.env,
        "EO_FAULT": "prepare.before_ledger",
        "EO_FAULT_ACTION": "pause",
        "EO_FAULT_ONCE": str(tmp_path / "paused-once"),
    }
    log = on_cluster.home / "dagtest-retry.log"
    on_cluster.logs.append(log)
    args = [sys.executable, str(DRIVER), "--dag-module", "eo_resume_dags"]
    with log.open("w") as output:
        proc = subprocess.Popen(
            args, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    on_cluster.procs.append(proc)
    reattached = re.compile(
        r"the prepare of checkpoint (\d+): its Spark driver (driver-[0-9-]+) is still (\w+): re-attaching"
    )
    try:

        def progress() -> bool:
            text = log.read_text(errors="replace")
            assert proc.poll() is None, f"dag.test exited ({proc.returncode}):\n{text[-6000:]}"
            new = [d for d in cluster.drivers() if d["id"] not in before]
            assert len(new) <= 1, f"a second driver was submitted: {new}\n{text[-6000:]}"
            return bool(reattached.search(text))

        # The retry re-attached while the first driver is held (no second driver meanwhile).
        assert poll_until(progress, timeout=300, interval=0.5), log.read_text(errors="replace")[-6000:]
        assert poll_until(lambda: bool(_our_processes(on_cluster, stopped=True)), timeout=300, interval=0.5)
        _release_stopped(on_cluster)  # the first driver records PREPARED and ends
        proc.wait(timeout=300)
    finally:
        _release_stopped(on_cluster)
        _kill_group(proc)
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert proc.returncode == 0 and lines, text[-6000:]
    (run,) = json.loads(lines[-1][len(RESULT_PREFIX) :])

    assert run["state"] == "success", (run, text[-6000:])
    assert run["tis"]["backfill"]["try_number"] == 2, run
    name, checkpoints = _backfill_done(on_cluster, run, committed)
    assert len(checkpoints) == 2, checkpoints
    first, second = (c.checkpoint_id for c in checkpoints)
    # Try 1 submitted the first checkpoint's driver and died polling it; the retry
    # re-attached to that driver and submitted one driver, the second checkpoint's.
    died = re.findall(r"injected: the task dies while polling driver (driver-[0-9-]+)", text)
    submitted = re.findall(r"Spark driver submitted: (driver-[0-9-]+)", text)
    assert [(int(c), d) for c, d, _ in reattached.findall(text)] == [(first, died[0])], text[-6000:]
    assert len(died) == 1 and len(submitted) == 2 and submitted[0] == died[0], (died, submitted)
    drivers = [d for d in cluster.drivers() if d["id"] not in before]
    assert {d["id"] for d in drivers} == set(submitted), drivers  # one driver per checkpoint
    assert {d["state"] for d in drivers} == {"FINISHED"}, drivers
    # Each driver's id under its own checkpoint's key: the second checkpoint's submission
    # found nothing stored for it, not the first checkpoint's finished driver.
    assert _stored(on_cluster) == {
        f"eo:prepare:{name}:{first}": submitted[0],
        f"eo:prepare:{name}:{second}": submitted[1],
    }
    assert "the ledger shows the work not done" not in text, text[-6000:]
    # The first checkpoint was prepared by the first try's driver (its actor), re-attached
    # to; the second by the retry's.
    with Ledger(pipeline.ledger_url) as ledger:
        prepared = [
            e.try_number
            for cp in (first, second)
            for e in ledger.events(name, cp)
            if e.to_state is CheckpointState.PREPARED
        ]
    assert prepared == [1, 2], prepared
    assert not _our_processes(on_cluster, stopped=True)
