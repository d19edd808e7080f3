"""Build a SparkSession that can read and write Kafka (the connector jars on its classpath).

Never imports Airflow: this module runs inside ``spark-submit``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: The Kafka connector's Maven artifact (without the Scala suffix).
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"


def connector_coordinate(spark_version: str, scala: str = "2.13") -> str:
    """The connector as Spark users give it to ``--packages``."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}_{scala}:{spark_version}"


def names_connector(*settings: str | None) -> bool:
    """Whether any of ``settings`` (packages, jars, spark.jars, spark.jars.packages) already
    names the Kafka connector."""
    return any(CONNECTOR_ARTIFACT in (value or "") for value in settings)


def connector_jars_csv() -> str:
    """Comma-separated paths of the Kafka connector jars (fetched on first use) and of eo's
    own Spark functions jar (compiled on first use, when a JDK is there)."""
    from airflow_provider_eo.stack.javac import udf_jar
    from airflow_provider_eo.stack.maven import spark_kafka_jars

    jars = spark_kafka_jars()
    own = udf_jar()
    return ",".join(str(p) for p in [*jars, *([own] if own else [])])


def local_spark_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a small local run: few shuffle partitions, no UI, quiet logs."""
    conf = {
        "spark.master": os.environ.get("EO_SPARK_MASTER", "local[2]"),
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        # Local runs stay on loopback (no other interface is ever contacted).
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Spark's Kafka source caches consumers per task; one local JVM needs few.
        "spark.kafka.consumer.cache.capacity": "16",
    }
    conf.update(extra or {})
    return conf


def get_spark(app_name: str = "eo", conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession with the Kafka connector jars; reuses the active one when it exists."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the driver's interpreter (the venv with pandas/pyarrow and
    # this package), not whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    settings = local_spark_conf(conf)
    under_submit = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))  # launched by spark-submit
    if under_submit:  # its --master/--jars/--conf rule unless the pipeline sets them
        for key in ("spark.master", "spark.driver.host", "spark.driver.bindAddress"):
            if key not in (conf or {}):
                settings.pop(key, None)
    elif "spark.jars" not in settings:
        settings["spark.jars"] = connector_jars_csv()
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("EO_SPARK_LOG_LEVEL", "WARN"))
    return spark
