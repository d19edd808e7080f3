"""The local development stack: a real Kafka broker and Spark's Kafka connector jars (and,
for the tests of Spark on YARN with staging on HDFS, Hadoop's own test cluster:
:mod:`airflow_provider_eo.stack.hadoop`).

The same code serves ``eo dev up``, the demo and the test fixtures.
"""

from __future__ import annotations

from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.kafka import KAFKA_VERSION, LocalKafka
from airflow_provider_eo.stack.maven import kafka_broker_jars, spark_kafka_jars
from airflow_provider_eo.stack.paths import state_dir

__all__ = [
    "KAFKA_VERSION",
    "LocalKafka",
    "StackError",
    "kafka_broker_jars",
    "spark_kafka_jars",
    "state_dir",
]
