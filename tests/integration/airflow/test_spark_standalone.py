"""The pipeline DAG on a Spark standalone cluster: a master and a worker started from the
installed Spark distribution on 127.0.0.1, executors in their own JVMs with their own
Python workers, a transform with a Python UDF living next to the DAGs (not installed on
the "cluster"), the PostgreSQL ledger.

The worker has a cluster node's environment: nothing on its PYTHONPATH. The prepare task
(EoSubmitOperator, ``spark://`` connection) ships the pipeline module and the transform
with ``py_files``; the connector is given with ``--jars`` as a Spark user would, and the
worker has no `eo setup jars` output, so the prepare uses the Arrow partitioner (logged).
Exactly once, audited; the applications ran on the standalone master.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_spark_standalone import StandaloneCluster

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.names import PREPARE_APP

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.cluster,
    pytest.mark.timeout(900),
]

# A Python UDF: pickled by reference to this module, so executors must import it.
TRANSFORM_MODULE = '''
"""A team's transform next to its DAGs: a Python UDF tagging each event."""
from pyspark.sql import functions as F
from pyspark.sql.types import StringType


def tag(value):
    return "standalone:" + bytes(value).decode()


def enrich(df):
    return df.withColumn("value", F.udf(tag, StringType())(F.col("value")))
'''


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_pipeline_dag_on_a_standalone_cluster_ships_the_transform(
    airflow_env: Any, kafka_bootstrap: str, standalone: StandaloneCluster, pg_fresh_url: str, tmp_path: Path
) -> None:
    from airflow_provider_eo.spark.session import CONNECTOR_ARTIFACT
    from airflow_provider_eo.stack.maven import spark_kafka_jars

    # The connector given as a Spark user gives it (--jars), and an empty eo home on the
    # worker: nothing from `eo setup jars`, so the partitioner falls back to the Arrow UDF.
    connector = ",".join(str(p) for p in spark_kafka_jars())
    assert CONNECTOR_ARTIFACT in connector
    module = f"acme_enrich_{uuid.uuid4().hex[:6]}"
    (airflow_env.dags / f"{module}.py").write_text(TRANSFORM_MODULE)
    host, port = standalone.master_url.rsplit(":", 1)
    airflow_env.env.update(
        {
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": host, "port": int(port)}),
            "EO_DEMO_TRANSFORM": f"{module}:enrich",
            "EO_LEDGER_URL": pg_fresh_url,
            "EO_DEMO_MAX_RECORDS": "1000",
            "EO_SPARK_JARS": connector,
            "EO_HOME": str(tmp_path / "empty-eo-home"),
        }
    )
    pipeline = airflow_env.pipeline()
    committed, _aborted = produce_sample(kafka_bootstrap, pipeline.source_topics[0])

    (run,) = airflow_env.run_dag_test("eo_pipeline", runs=1)

    assert run["state"] == "success", (run, standalone.log_tail(), standalone.executor_logs()[-3000:])
    log = airflow_env.log_text()
    assert f"{module}.py" in log and "shipping to the executors (py_files)" in log
    assert "eo's JVM partitioner jar is not installed on this worker" in log  # the task says it
    assert "sink partitions are computed by the Arrow UDF" in log  # and so does the driver
    with Ledger(pipeline.ledger_url) as ledger:
        report = audit_pipeline(pipeline, ledger)
        checkpoints = ledger.list_checkpoints(pipeline.name)
    assert report.ok and report.duplicates == 0 and report.missing == 0, report.as_dict()
    assert [c.state for c in checkpoints] == [CheckpointState.COMMITTED]
    assert checkpoints[0].records == committed
    sink = read_sink({"bootstrap.servers": kafka_bootstrap}, pipeline.sink_topic)
    values = [r.value().decode() for r in sink]
    assert len(values) == committed and all(v.startswith("standalone:") for v in values)
    # The prepare ran on the standalone master, in executors of the worker.
    apps = standalone.state()
    assert any(a["name"].startswith(PREPARE_APP) for a in apps.get("completedapps", [])), apps
    assert list((standalone.home / "work").rglob("stderr")), "no executor ran on the worker"
