"""Build a SparkSession that can read and write Kafka (the connector jars on its classpath).

Never imports Airflow: this module runs inside ``spark-submit``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: The Kafka connector's Maven artifact (without the Scala suffix).
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"


def connector_coordinate(spark_version: str, scala: str = "2.13") -> str:
    """The connector as Spark users give it to ``--packages``."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}_{scala}:{spark_version}"


#: Hadoop's S3A connector's Maven artifact: on Spark's classpath when staging is under ``s3a://``.
HADOOP_AWS_ARTIFACT = "hadoop-aws"


def names_hadoop_aws(*settings: str | None) -> bool:
    """Whether any of ``settings`` (packages, jars, spark.jars, spark.jars.packages) already
    names Hadoop's S3A connector."""
    return any(HADOOP_AWS_ARTIFACT in (value or "") for value in settings)


def names_connector(*settings: str | None) -> bool:
    """Whether any of ``settings`` (packages, jars, spark.jars, spark.jars.packages) already
    names the Kafka connector."""
    return any(CONNECTOR_ARTIFACT in (value or "") for value in settings)


def connector_jars_csv(staging_dir: str | None = None) -> str:
    """Comma-separated paths of the Kafka connector jars (fetched on first use) and of eo's
    own Spark functions jar (compiled on first use, when a JDK is there); with a
    ``staging_dir`` under ``s3a://`` (or ``s3://``), also Hadoop's S3A connector with its AWS
    SDK bundle at pyspark's Hadoop version (fetched on first use)."""
    from airflow_provider_eo.stack.javac import udf_jar
    from airflow_provider_eo.stack.maven import hadoop_aws_jars, spark_kafka_jars
    from airflow_provider_eo.staging_fs import is_s3_location

    jars = [*spark_kafka_jars()]
    if is_s3_location(staging_dir):
        jars += hadoop_aws_jars()
    own = udf_jar()
    return ",".join(str(p) for p in [*jars, *([own] if own else [])])


#: Settings eo needs whoever starts Spark (applied unless the user set them).
REQUIRED_DEFAULTS = {"spark.sql.session.timeZone": "UTC"}


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local-cluster[...]``: Spark in this machine."""
    return master == "local" or master.startswith(("local[", "local-"))


def local_spark_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a Spark eo starts itself: for a local master, a small local run
    (few shuffle partitions, no UI, loopback only, a small consumer cache); for a cluster
    master only what eo needs (the UI, memory, partitions and addresses are the user's)."""
    master = (extra or {}).get("spark.master") or os.environ.get("EO_SPARK_MASTER", "local[2]")
    conf = {"spark.master": master, **REQUIRED_DEFAULTS}
    if is_local_master(master):
        conf.update(
            {
                "spark.sql.shuffle.partitions": "4",
                "spark.ui.enabled": "false",
                "spark.driver.memory": "1g",
                # Local runs stay on loopback (no other interface is ever contacted).
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                # Spark's Kafka source caches consumers per task; one local JVM needs few.
                "spark.kafka.consumer.cache.capacity": "16",
            }
        )
    conf.update(extra or {})
    return conf


def _submitted_conf() -> dict[str, str]:
    """What spark-submit gave this driver (``--conf``, ``--master``, the defaults file): the
    JVM's SparkConf before any session exists."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # the submit's gateway: else SparkConf loads nothing
    return dict(SparkConf().getAll())


def session_settings(conf: Mapping[str, str] | None, *, under_submit: bool) -> dict[str, str]:
    """The builder settings of a new session. Started by eo: :func:`local_spark_conf`.
    Under spark-submit, the submit's settings win: the pipeline's ``spark_conf`` and eo's
    required defaults fill in only what it did not set, and no local default applies."""
    if not under_submit:
        return local_spark_conf(conf)
    given = _submitted_conf()
    wanted = {**REQUIRED_DEFAULTS, **(conf or {})}
    return {k: v for k, v in wanted.items() if k not in given}


def _start_with_env(builder: Any, env: Mapping[str, str]) -> SparkSession:
    """``builder.getOrCreate()`` with ``env`` in this process's environment only while it
    runs (a JVM launched by PySpark inherits it; the values are taken back right after)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return builder.getOrCreate()
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def get_spark(
    app_name: str = "eo",
    conf: Mapping[str, str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    staging_dir: str | None = None,
) -> SparkSession:
    """A SparkSession with the Kafka connector jars; reuses the active one when it exists.

    Under spark-submit the submit's settings (``--conf``, the operator's ``conf``) are never
    overridden; eo's local defaults apply only when it starts Spark itself on a local master.

    :param env: environment variables for the JVM started here (the staging store's
        credentials from an Airflow connection: :func:`~airflow_provider_eo.staging_fs.jvm_environment`);
        set only while the JVM starts, never in Spark conf. Unused when a JVM already runs.
    :param staging_dir: where this session stages: under ``s3a://``, a session eo starts
        (not under spark-submit, no ``spark.jars`` given) gets Hadoop's S3A connector too.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    under_submit = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))  # launched by spark-submit
    master = (conf or {}).get("spark.master") or os.environ.get("EO_SPARK_MASTER", "local[2]")
    if not under_submit and is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the driver's interpreter (the venv with pandas/pyarrow and
    # this package), not whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    settings = session_settings(conf, under_submit=under_submit)
    if not under_submit and "spark.jars" not in settings:
        settings["spark.jars"] = connector_jars_csv(staging_dir)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = _start_with_env(builder, env or {})
    spark.sparkContext.setLogLevel(os.environ.get("EO_SPARK_LOG_LEVEL", "WARN"))
    return spark
