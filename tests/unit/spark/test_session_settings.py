"""Which Spark settings a new session gets (spark/session.py): eo's local defaults only when
it starts Spark itself on a local master; under spark-submit the submit's settings win."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.spark import session


def test_local_master_gets_the_small_local_defaults_and_the_pipeline_wins() -> None:
    got = session.session_settings(
        {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "9"}, under_submit=False
    )
    assert got["spark.sql.shuffle.partitions"] == "9"
    assert got["spark.ui.enabled"] == "false" and got["spark.driver.host"] == "127.0.0.1"
    assert got["spark.sql.session.timeZone"] == "UTC"


def test_a_cluster_master_started_by_eo_keeps_the_users_ui_memory_and_addresses() -> None:
    got = session.session_settings({"spark.master": "spark://m:7077"}, under_submit=False)
    assert got == {"spark.master": "spark://m:7077", "spark.sql.session.timeZone": "UTC"}


def test_under_spark_submit_its_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = {
        "spark.master": "yarn",
        "spark.sql.shuffle.partitions": "37",
        "spark.app.name": "eo-prepare",
    }
    monkeypatch.setattr(session, "_submitted_conf", lambda: dict(submitted))
    got = session.session_settings(
        {"spark.sql.shuffle.partitions": "4", "spark.master": "local[2]", "spark.executor.cores": "3"},
        under_submit=True,
    )
    # The pipeline fills in what the submit did not set; no local default (UI, memory, 4).
    assert got == {"spark.executor.cores": "3", "spark.sql.session.timeZone": "UTC"}
    submitted["spark.sql.session.timeZone"] = "Europe/Paris"
    assert session.session_settings(None, under_submit=True) == {}


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://h:7077", False),
        ("yarn", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert session.is_local_master(master) is local


def test_a_session_eo_starts_gets_hadoop_aws_when_staging_on_s3a(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hadoop's S3A connector joins the Kafka connector on the classpath of a session eo
    starts for a pipeline staging under s3a://, and only then."""
    import airflow_provider_eo.stack.javac as javac
    import airflow_provider_eo.stack.maven as maven
    from airflow_provider_eo.spark.session import connector_jars_csv

    monkeypatch.setattr(maven, "spark_kafka_jars", lambda: ["/j/kafka.jar"])
    monkeypatch.setattr(maven, "hadoop_aws_jars", lambda: ["/j/hadoop-aws.jar", "/j/bundle.jar"])
    monkeypatch.setattr(javac, "udf_jar", lambda: None)
    assert connector_jars_csv("s3a://b/staging") == "/j/kafka.jar,/j/hadoop-aws.jar,/j/bundle.jar"
    assert connector_jars_csv("S3://b/staging") == "/j/kafka.jar,/j/hadoop-aws.jar,/j/bundle.jar"
    for other in ("hdfs://nn/staging", "/tmp/staging", "gs://b/x", None):
        assert connector_jars_csv(other) == "/j/kafka.jar", other


def test_the_stager_starts_its_session_for_the_staging_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.spark.session as session
    from airflow_provider_eo.pipeline import Pipeline
    from airflow_provider_eo.spark.stager import SparkStager

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_get_spark(app: str, conf: Any = None, *, env: Any = None, staging_dir: Any = None) -> Any:
        seen["staging_dir"] = staging_dir
        raise Stop

    monkeypatch.setattr(session, "get_spark", fake_get_spark)
    pipeline = Pipeline(
        name="p",
        kafka={"bootstrap.servers": "x:1"},
        source_topics=["a"],
        sink_topic="b",
        staging_dir="s3a://bucket/p",
    )
    with pytest.raises(Stop):
        SparkStager().session(pipeline)
    assert seen == {"staging_dir": "s3a://bucket/p"}
