"""The pipeline DAG on YARN, staging on HDFS: Hadoop's own test cluster (a MiniYARNCluster and
a MiniDFSCluster in one JVM, :mod:`airflow_provider_eo.stack.hadoop`), one per module.

The NodeManager runs its containers on this machine, so a node's "image" is this venv: Spark's
jars are given as ``local:`` (``spark.yarn.jars``, nothing uploaded per application) and the
Python of drivers and executors is the venv's (``spark.pyspark.python``). The cluster's JVM
starts with a clean environment: nothing of the tests (no PYTHONPATH, no AIRFLOW_*, no
credentials) reaches a container except what the application itself carries.

- cluster deploy mode: the prepare and the commit applications run as YARN applications
  (drivers in application-master containers); the ledger is an Airflow connection named by
  id and read by the driver from the node's secrets backend (the node's airflow.cfg names a
  connections file; the application carries only the AIRFLOW_HOME path). The first prepare's driver dies after
  writing its staged files; the task fails, is retried, and the checkpoint is prepared once.
  No secret in Spark conf, in the applications' launch environment or in the
  ResourceManager's view of them.
- client deploy mode: the drivers run in the Airflow tasks, the executors on YARN.

Both run against one pipeline, staging under ``hdfs://``; every source record is in the sink
exactly once.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_jvm_archive import SHORT_LIVED_JVM
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.names import COMMIT_APP, PREPARE_APP
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.hadoop import HadoopInfo, MiniHadoop

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.hadoop,
    pytest.mark.timeout(900),
]

LEDGER_CONN_ID = "eo_yarn_ledger"

PIPELINE_MODULE = '''
"""The YARN test's pipeline: shipped to the drivers with py_files, nothing from the environment."""
from airflow_provider_eo.pipeline import Pipeline

pipeline = Pipeline(**{spec!r})
'''

DAG_MODULE = '''
"""The eo group on YARN in {mode} deploy mode, commit on Spark too."""
import json
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_eo.task_group import eo_pipeline_group

with DAG(dag_id="eo_yarn_{mode}", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    eo_pipeline_group(
        "yarn_pipeline:pipeline",
        group_id="eo",
        spark_conn_id="spark_yarn",
        deploy_mode="{mode}",
        spark_conf=json.loads({conf!r}),
        commit_mode="spark",
        prepare_kwargs=json.loads({submit!r}),
        commit_kwargs=json.loads({submit!r}),
        poke_interval=2,
        timeout=600,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
'''


@pytest.fixture(scope="module")
def hadoop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MiniHadoop, HadoopInfo]]:
    cluster = MiniHadoop(tmp_path_factory.mktemp("hadoop"))
    info = cluster.up()
    try:
        yield cluster, info
    finally:
        cluster.down()


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def yarn_conf(node: Path) -> dict[str, str]:
    """Spark settings of a YARN application on this "node": its jars and Python are this
    venv's; small containers; the driver's Airflow configuration is the node's."""
    env = "spark.yarn.appMasterEnv."
    return {
        "spark.yarn.jars": f"local:{_spark_home() / 'jars'}/*",
        "spark.pyspark.python": sys.executable,
        "spark.executor.instances": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "512m",
        "spark.yarn.am.memory": "512m",
        # Short-lived containers on a small shared machine: the client JIT, the serial
        # collector (the executors get the same from the tests' spark-defaults.conf).
        "spark.yarn.am.extraJavaOptions": SHORT_LIVED_JVM,
        # A dead driver fails its task at once; Airflow's retry submits anew.
        "spark.yarn.maxAppAttempts": "1",
        f"{env}SPARK_LOCAL_IP": "127.0.0.1",
        "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
        # The node's Airflow configuration (its secrets backend): only a path travels.
        f"{env}AIRFLOW_HOME": str(node / "airflow"),
    }


def test_pipeline_dag_on_yarn_cluster_and_client_mode_stages_on_hdfs_exactly_once(
    airflow_env: Any,
    kafka_bootstrap: str,
    hadoop: tuple[MiniHadoop, HadoopInfo],
    pg_fresh_url: str,
    tmp_path: Path,
) -> None:
    from sqlalchemy.engine import make_url

    cluster, info = hadoop
    secret = f"eo-secret-{uuid.uuid4().hex[:10]}"
    server = make_url(pg_fresh_url)
    # Trust auth on the test server: any password is accepted, so it can be a canary.
    ledger_conn = {
        "conn_type": "postgres",
        "host": server.host,
        "port": server.port,
        "schema": server.database,
        "login": server.username,
        "password": secret,
    }
    # The "node's" secrets backend: a connections file named in its airflow.cfg. (Not in the
    # application's environment: YARN writes spark.yarn.appMasterEnv.* values into
    # launch_container.sh without escaping double quotes, so a JSON backend_kwargs arrives
    # broken and the backend finds nothing.)
    node = tmp_path / "node"
    (node / "airflow").mkdir(parents=True)
    (node / "connections.json").write_text(json.dumps({LEDGER_CONN_ID: ledger_conn}))
    kwargs = json.dumps({"connections_file_path": str(node / "connections.json")})
    (node / "airflow" / "airflow.cfg").write_text(
        "[secrets]\nbackend = airflow.secrets.local_filesystem.LocalFilesystemBackend\n"
        f"backend_kwargs = {kwargs}\n"
    )
    name = f"yarn-{uuid.uuid4().hex[:8]}"
    staging = f"{info.default_fs}/eo/{name}/staging"
    spec = {
        "name": name,
        "kafka": {"bootstrap.servers": kafka_bootstrap},
        "ledger_conn_id": LEDGER_CONN_ID,
        "source_topics": [airflow_env.env["EO_DEMO_SOURCE_TOPIC"]],
        "sink_topic": airflow_env.env["EO_DEMO_SINK_TOPIC"],
        "staging_dir": staging,
        # The sample's 69 source offsets: two checkpoints, one per deploy mode.
        "max_records_per_checkpoint": 40,
        "spark_conf": {"spark.sql.shuffle.partitions": "2"},
    }
    (airflow_env.dags / "yarn_pipeline.py").write_text(PIPELINE_MODULE.format(spec=spec))
    conf = json.dumps(yarn_conf(node))
    for mode in ("cluster", "client"):
        # Cluster mode: the Spark provider's durable submit tracks the driver through the
        # ResourceManager's REST API (its only way on YARN), and a retry may re-attach to it.
        submit = json.dumps(
            {"yarn_track_via_rm_api": True, "status_poll_interval": 2} if mode == "cluster" else {}
        )
        (airflow_env.dags / f"eo_yarn_{mode}.py").write_text(
            DAG_MODULE.format(mode=mode, conf=conf, submit=submit)
        )
    airflow_env.env.update(
        {
            "HADOOP_CONF_DIR": str(info.conf_dir),
            "AIRFLOW_CONN_SPARK_YARN": json.dumps(
                {
                    "conn_type": "spark",
                    "host": "yarn",
                    "extra": {"yarn_resourcemanager_webapp_address": f"http://{info.rm_web}"},
                }
            ),
            f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps(ledger_conn),
        }
    )
    url = server.set(password=secret).render_as_string(hide_password=False)
    pipeline = Pipeline(**{**spec, "ledger_conn_id": None, "ledger_url": url})
    committed, aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (cluster_run,) = airflow_env.run_dag_test("eo_yarn_cluster", runs=1, prepare_fault_runs="1")
    (client_run,) = airflow_env.run_dag_test("eo_yarn_client", runs=1)

    logs = cluster.container_logs()
    for run in (cluster_run, client_run):
        assert run["state"] == "success", (run, airflow_env.log_text()[-6000:], cluster.log_tail())
        assert run["xcoms"]["eo.commit"]["state"] == "COMMITTED", run
        assert run["xcoms"]["eo.commit"]["commit_mode"] == "spark", run
    # The cluster run's prepare died once (its driver, in YARN) and was retried.
    assert cluster_run["tis"]["eo.prepare"]["try_number"] == 2, cluster_run
    assert client_run["tis"]["eo.prepare"]["try_number"] == 1, client_run
    assert "injected fault at prepare.after_write" in "".join(logs.values())
    with Ledger(url) as ledger:
        report = audit_pipeline(pipeline, ledger)
        checkpoints = ledger.list_checkpoints(pipeline.name)
        events = ledger.events(pipeline.name, checkpoints[0].checkpoint_id)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
    assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED] * 2
    assert all((c.staging_location or "").startswith(f"{info.default_fs}/eo/{name}/") for c in checkpoints)
    prepared = [e for e in events if e.to_state is CheckpointState.PREPARED]
    assert len(prepared) == 1 and prepared[0].try_number == 2, prepared
    # Counted against the source: every committed source record once, nothing aborted.
    source_sink = assert_sink_is_source_exactly_once(pipeline.kafka, pipeline, source_records=committed)
    assert source_sink.sink == committed == 40 and aborted == 20, source_sink.describe()

    # YARN ran eo's applications: the cluster run's drivers (prepare twice, commit) in
    # application masters; the client run's executors.
    apps = info.applications()
    names = sorted(a["name"] for a in apps)
    assert sum(n.startswith(PREPARE_APP) for n in names) == 3, names
    assert sum(n.startswith(COMMIT_APP) for n in names) == 2, names
    assert sorted(a["finalStatus"] for a in apps).count("FAILED") == 1, [
        (a["name"], a["finalStatus"]) for a in apps
    ]
    # No secret in the ResourceManager's view, the applications' launch environment
    # (launch_container.sh), their localized Spark conf, their logs, or the task logs.
    assert secret not in json.dumps(apps)
    launch_files = ("launch_container.sh", "__spark_conf__.properties")
    launched = [p for p in cluster.home.rglob("*") if p.is_file() and p.name in launch_files]
    assert any(p.name == "__spark_conf__.properties" for p in launched), "no localized Spark conf found"
    for path in launched:
        text = path.read_text(errors="replace")
        assert secret not in text, path
    assert any(str(node / "airflow") in p.read_text(errors="replace") for p in launched)
    assert secret not in "".join(logs.values())
    task_logs = airflow_env.log_text() + "".join(
        p.read_text(errors="replace") for p in (airflow_env.home / "logs").rglob("*") if p.is_file()
    )
    assert secret not in task_logs and secret not in json.dumps([cluster_run, client_run])
