"""EoSubmitOperator: idempotent skip, lazy jars, the client-mode environment."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.submit import (
    EoSubmitOperator,
    _merge_csv,
    local_driver_env,
    module_root,
    prepare_application,
)
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowFailException, AirflowSkipException


def test_no_work_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.spark.session as session

    monkeypatch.setattr(session, "connector_jars_csv", lambda: pytest.fail("jars resolved at parse time"))
    op = EoSubmitOperator(task_id="prepare", pipeline="no.such:X", checkpoint_id="{{ x }}")
    assert op.jars is None and op.application == ""
    assert {"pipeline", "checkpoint_id", "jars", "env_vars"} <= set(op.template_fields)


def test_prepare_application_is_the_package_file() -> None:
    path = prepare_application()
    assert path.endswith("airflow_provider_eo/apps/prepare.py")


def test_module_root_and_env(pipeline_ref: str, tmp_path: Any) -> None:
    assert module_root(pipeline_ref) == str(tmp_path)
    env = local_driver_env(pipeline_ref)
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert module_root("airflow_provider_eo.examples.transforms:enrich") is not None


def test_merge_csv() -> None:
    assert _merge_csv("a.jar,b.jar", "b.jar,c.jar") == "a.jar,b.jar,c.jar"
    assert _merge_csv(None, "") is None


def _plan(pipeline: Any) -> Ledger:
    ledger = Ledger(pipeline.ledger_url)
    ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    return ledger


def test_already_prepared_submits_nothing(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with _plan(pipeline) as ledger:
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
    monkeypatch.setattr(EoSubmitOperator, "_get_hook", lambda self: pytest.fail("spark-submit called"))
    op = EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="1")
    assert op.execute(context) == {
        "pipeline": "orders",
        "checkpoint_id": 1,
        "state": "PREPARED",
        "submitted": False,
    }


def test_aborted_fails_without_retry(pipeline_ref: str, context: dict[str, Any]) -> None:
    pipeline = load_pipeline(pipeline_ref)
    with _plan(pipeline) as ledger:
        ledger.abort(pipeline.name, 1, reason="test")
    with pytest.raises(AirflowFailException, match="ABORTED"):
        EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id=1).execute(context)


def test_no_checkpoint_skips(pipeline_ref: str, context: dict[str, Any]) -> None:
    with pytest.raises(AirflowSkipException):
        EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="").execute(context)


def _submit_task(**kwargs: Any) -> EoSubmitOperator:
    return EoSubmitOperator(task_id="prepare", pipeline="m:P", checkpoint_id=1, **kwargs)


def test_task_time_jars_never_build_and_say_what_to_set(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Maven/javac at task time: the connector comes from the task's settings or from what
    `eo setup jars` installed; with neither, the task fails naming the coordinate."""
    from airflow_provider_eo.operators.submit import add_task_time_jars
    from airflow_provider_eo.stack.maven import installed_spark_version

    monkeypatch.setenv("EO_HOME", str(tmp_path / "home"))  # nothing installed there
    monkeypatch.setenv("EO_FORBID_BUILD_TOOLS", "1")
    version = installed_spark_version()
    coordinate = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"

    bare = _submit_task()
    expected = rf"not configured for task 'prepare'.*packages='{coordinate}'"
    with pytest.raises(AirflowFailException, match=expected):
        add_task_time_jars(bare, "orders")

    for given in ({"packages": coordinate}, {"conf": {"spark.jars.packages": coordinate}}):
        task = _submit_task(**given)
        add_task_time_jars(task, "orders")  # the user's connector; the partitioner is missing
        assert task.jars is None

    jars = tmp_path / "home" / "jars"
    connector = jars / f"spark-sql-kafka-{version}"
    connector.mkdir(parents=True)
    (connector / "spark-sql-kafka-0-10_2.13.jar").write_bytes(b"")
    (connector / ".complete").write_text("done")
    from airflow_provider_eo.stack.javac import udf_jar_path

    udf_jar_path(version).write_bytes(b"")
    installed = _submit_task(jars="/opt/extra.jar")
    add_task_time_jars(installed, "orders")
    assert installed.jars is not None
    assert installed.jars.split(",") == [
        "/opt/extra.jar",
        str(connector / "spark-sql-kafka-0-10_2.13.jar"),
        str(udf_jar_path(version)),
    ]


def test_build_tools_are_refused_where_forbidden(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.stack.errors import StackError
    from airflow_provider_eo.stack.javac import udf_jar
    from airflow_provider_eo.stack.maven import spark_kafka_jars

    monkeypatch.setenv("EO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EO_FORBID_BUILD_TOOLS", "1")
    with pytest.raises(StackError, match=r"would need Maven, which may not run here.*eo setup jars"):
        spark_kafka_jars()
    with pytest.raises(StackError, match="would need javac"):
        udf_jar()


def _installed(folder: Any, jar: str) -> Any:
    folder.mkdir(parents=True)
    (folder / jar).write_bytes(b"")
    (folder / ".complete").write_text("done")
    return folder / jar


def test_task_time_jars_add_hadoop_aws_when_staging_on_s3a(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging under s3a://: Hadoop's S3A connector that `eo setup jars --s3` installed goes
    with the connector, unless the task names it already; not installed, the task says so."""
    from airflow_provider_eo.operators.submit import add_task_time_jars
    from airflow_provider_eo.stack.maven import installed_spark_version, spark_hadoop_version

    monkeypatch.setenv("EO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EO_FORBID_BUILD_TOOLS", "1")
    warned: list[str] = []
    log = SimpleNamespace(warning=lambda msg, *args: warned.append(msg % args), info=lambda *a: None)
    monkeypatch.setattr(EoSubmitOperator, "log", log)
    jars = tmp_path / "home" / "jars"
    connector = _installed(jars / f"spark-sql-kafka-{installed_spark_version()}", "spark-sql-kafka.jar")

    missing = _submit_task()
    add_task_time_jars(missing, "orders", "s3a://bucket/staging")
    assert missing.jars == str(connector)
    assert any("hadoop-aws) is neither given to task 'prepare'" in w for w in warned), warned

    s3a = _installed(jars / f"hadoop-aws-{spark_hadoop_version()}", "hadoop-aws.jar")
    for staging, expected in (
        ("s3a://bucket/staging", [str(connector), str(s3a)]),
        ("s3://bucket/staging", [str(connector), str(s3a)]),
        ("hdfs://nn:8020/staging", [str(connector)]),
        ("/var/eo/staging", [str(connector)]),
        (None, [str(connector)]),
    ):
        task = _submit_task()
        add_task_time_jars(task, "orders", staging)
        assert (task.jars or "").split(",") == expected, staging
    given = _submit_task(packages="org.apache.hadoop:hadoop-aws:3.5.0")
    add_task_time_jars(given, "orders", "s3a://bucket/staging")
    assert given.jars == str(connector)


def test_prepare_submit_passes_the_staging_dir(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator hands the pipeline's staging_dir to the jar selection."""
    import airflow_provider_eo.operators.submit as submit_mod

    seen: list[Any] = []
    monkeypatch.setattr(
        submit_mod, "add_task_time_jars", lambda task, name, staging_dir=None, **kw: seen.append(staging_dir)
    )
    monkeypatch.setattr(submit_mod, "resume_submission", lambda *a, **k: None)
    monkeypatch.setattr(submit_mod.SparkSubmitOperator, "execute", lambda self, ctx: None)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[1]"}')
    pipeline = load_pipeline(pipeline_ref)
    _plan(pipeline).close()
    op = EoSubmitOperator(task_id="prepare", pipeline=pipeline_ref, checkpoint_id="1")
    with pytest.raises(Exception, match="finished but checkpoint 1 is PLANNED"):
        op.execute(context)
    assert seen == [pipeline.staging_dir]
