"""The staging filesystem layer: Hadoop schemes mapped to pyarrow's, and the one precedence of
S3 settings (spark_conf, then AWS_* environment, then an Airflow connection)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.fs as pafs
import pytest

from airflow_provider_eo import staging_fs
from airflow_provider_eo.connections import ConnectionSettings, apply_settings
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.pipeline import Pipeline

S3A = "spark.hadoop.fs.s3a."
CONN = ConnectionSettings(
    aws_conn_id="aws_staging",
    aws={
        "access_key": "conn-id",
        "secret_key": "conn-secret",
        "session_token": None,
        "region": "eu-west-3",
        "endpoint": "http://conn-host:9000",
        "path_style": "true",
    },
)


def _pipeline(**kw: Any) -> Pipeline:
    base: dict[str, Any] = dict(
        name="p",
        kafka={"bootstrap.servers": "b:9092"},
        source_topics=["in"],
        sink_topic="out",
        staging_dir="s3a://bucket/eo",
    )
    return Pipeline(**{**base, **kw})


ENV = {
    "AWS_ACCESS_KEY_ID": "env-id",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
    "AWS_SESSION_TOKEN": "env-token",
    "AWS_ENDPOINT_URL": "http://env-host:1",
    "AWS_ENDPOINT_URL_S3": "http://env-s3-host:2",
    "AWS_DEFAULT_REGION": "us-west-1",
    "AWS_REGION": "us-west-2",
}


def test_spark_conf_comes_first_then_the_environment_then_the_connection() -> None:
    conf = {
        f"{S3A}endpoint": "http://conf-host:3",
        f"{S3A}access.key": "conf-id",
        f"{S3A}secret.key": "conf-secret",
        f"{S3A}path.style.access": "true",
    }
    connected = apply_settings(_pipeline(spark_conf=conf), CONN)
    s3 = staging_fs.store_for(connected, environ=ENV).s3
    assert (s3.endpoint, s3.access_key, s3.secret_key, s3.credentials_from) == (
        "http://conf-host:3",
        "conf-id",
        "conf-secret",
        "spark_conf",
    )
    assert s3.session_token is None  # the credentials are one set: no token from the env
    assert s3.region == "us-west-2" and s3.path_style is True  # AWS_REGION over AWS_DEFAULT_REGION

    env_only = staging_fs.store_for(apply_settings(_pipeline(), CONN), environ=ENV).s3
    assert (env_only.endpoint, env_only.access_key, env_only.session_token) == (
        "http://env-s3-host:2",  # AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL
        "env-id",
        "env-token",
    )
    assert env_only.credentials_from == "environment"

    conn_only = staging_fs.store_for(apply_settings(_pipeline(), CONN), environ={}).s3
    assert (conn_only.endpoint, conn_only.region, conn_only.access_key, conn_only.path_style) == (
        "http://conn-host:9000",
        "eu-west-3",
        "conn-id",
        True,
    )
    assert conn_only.credentials_from == "connection 'aws_staging'"

    nothing = staging_fs.store_for(_pipeline(), environ={}).s3
    assert nothing.credentials_from == "default chain" and nothing.access_key is None


def test_a_bucket_of_its_own_overrides_the_global_s3a_settings() -> None:
    conf = {f"{S3A}endpoint": "http://global:1", f"{S3A}bucket.other.endpoint": "http://other:2"}
    store = staging_fs.store_for(_pipeline(spark_conf=conf), environ={})
    assert store.s3_for("bucket").endpoint == "http://global:1"
    assert store.s3_for("other").endpoint == "http://other:2"


def test_secrets_never_show_in_repr_or_messages_and_the_store_travels_to_executors() -> None:
    store = staging_fs.store_for(_pipeline(), environ=ENV)
    for text in (repr(store), store.s3.describe(), repr(CONN), repr(apply_settings(_pipeline(), CONN))):
        for secret in ("env-secret", "env-token", "conn-secret"):
            assert secret not in text, text
    assert pickle.loads(pickle.dumps(store)) == store


def test_spark_gets_the_non_secret_settings_and_never_a_secret() -> None:
    pipeline = apply_settings(_pipeline(), CONN)
    conf = staging_fs.spark_settings(pipeline)
    assert conf[f"{S3A}endpoint"] == "http://conn-host:9000"
    assert conf[f"{S3A}endpoint.region"] == "eu-west-3"
    assert conf[f"{S3A}path.style.access"] == "true"
    assert conf[f"{S3A}connection.ssl.enabled"] == "false"  # an http:// endpoint
    assert "EnvironmentVariableCredentialsProvider" in conf[f"{S3A}aws.credentials.provider"]
    assert not any("conn-secret" in v or "conn-id" in v for v in conf.values())
    # The connection's credentials reach only the JVM eo starts, through its environment.
    assert staging_fs.jvm_environment(pipeline) == {
        "AWS_ACCESS_KEY_ID": "conn-id",
        "AWS_SECRET_ACCESS_KEY": "conn-secret",
    }
    # What the pipeline set itself is never overridden; a local staging_dir adds nothing.
    mine = {f"{S3A}endpoint": "http://mine:1"}
    assert staging_fs.spark_settings(dataclasses.replace(pipeline, spark_conf=mine))[f"{S3A}endpoint"] == (
        "http://mine:1"
    )
    local = dataclasses.replace(pipeline, staging_dir="/tmp/x", spark_conf={"a": "b"})
    assert staging_fs.spark_settings(local) == {"a": "b"} and staging_fs.jvm_environment(local) == {}


def test_hadoop_schemes_open_pyarrow_s3_on_the_same_bucket_and_key() -> None:
    conf = {f"{S3A}endpoint": "http://127.0.0.1:9", f"{S3A}path.style.access": "true"}
    store = staging_fs.store_for(_pipeline(spark_conf=conf), environ={})
    for scheme in ("s3a", "s3", "s3n"):
        fs, path = store.open(f"{scheme}://bucket/eo/p/cp-1/")
        assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/eo/p/cp-1"
    with pytest.raises(ConfigError, match="names no bucket"):
        store.open("s3a:///eo")


def test_local_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fs, path = staging_fs.with_store(None).open("rel/dir")
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "rel" / "dir")


def test_azure_needs_container_and_account() -> None:
    if getattr(pafs, "AzureFileSystem", None) is None:
        with pytest.raises(ConfigError, match="AzureFileSystem"):
            staging_fs.with_store(None).open("abfss://c@acct.dfs.core.windows.net/x")
        return
    with pytest.raises(ConfigError, match="abfss://CONTAINER@ACCOUNT"):
        staging_fs.with_store(None).open("abfss://nothing/x")


def test_the_aws_connection_travels_in_the_handoff_and_is_cleared_once_applied() -> None:
    again = ConnectionSettings.from_json(CONN.to_json())
    assert again.aws == CONN.aws and again.aws_conn_id == "aws_staging"
    pipeline = _pipeline(aws_conn_id="aws_staging")
    assert pipeline.connection_ids == {"aws_conn_id": "aws_staging"}
    applied = apply_settings(pipeline, CONN)
    assert applied.connection_ids == {} and applied.aws_settings is not None
    assert "conn-secret" not in applied.to_json()  # never on a command line
    assert Pipeline.from_json(pipeline.to_json()).aws_conn_id == "aws_staging"


def _hdfs_site(folder: Path, http: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hdfs-site.xml").write_text(
        "<configuration><property><name>dfs.namenode.http-address</name>"
        f"<value>{http}</value></property></configuration>"
    )
    return folder


def test_hdfs_goes_through_webhdfs_found_in_the_hadoop_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Hadoop's native client, hdfs:// is read through the NameNode's WebHDFS: its
    address from HADOOP_CONF_DIR, else the copy Spark ships to a YARN container, else port
    9870 of the URI's host; as HADOOP_USER_NAME."""
    from fsspec.implementations.webhdfs import WebHDFS

    for key in ("ARROW_LIBHDFS_DIR", "HADOOP_HOME", "HADOOP_CONF_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HADOOP_USER_NAME", "etl")
    monkeypatch.chdir(tmp_path)
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(
        WebHDFS,
        "__init__",
        lambda self, host, port, user: made.append({"host": host, "port": port, "user": user}),
    )
    monkeypatch.setattr(pafs, "FSSpecHandler", lambda fs: None)
    monkeypatch.setattr(pafs, "PyFileSystem", lambda handler: "webhdfs")

    assert staging_fs.StagingStore().open("hdfs://nn.example:8020/eo/staging/") == ("webhdfs", "/eo/staging")
    _hdfs_site(tmp_path / "__spark_conf__" / "__hadoop_conf__", "0.0.0.0:50070")  # in a YARN container
    staging_fs.hdfs_filesystem("hdfs://nn.example:8020/eo")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hdfs_site(tmp_path / "conf", "web.example:9871")))
    staging_fs.hdfs_filesystem("hdfs://nn.example:8020/eo")
    assert made == [
        {"host": "nn.example", "port": 9870, "user": "etl"},
        {"host": "nn.example", "port": 50070, "user": "etl"},
        {"host": "web.example", "port": 9871, "user": "etl"},
    ]
    with pytest.raises(ConfigError, match="names no NameNode"):
        staging_fs.hdfs_filesystem("hdfs:///eo")


def test_hdfs_uses_the_native_client_where_hadoop_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROW_LIBHDFS_DIR", "/opt/hadoop/lib/native")
    native = SimpleNamespace(from_uri=lambda uri: ("native", "/eo"))
    monkeypatch.setattr(staging_fs, "pafs", SimpleNamespace(FileSystem=native))
    assert staging_fs.hdfs_filesystem("hdfs://nn:8020/eo") == ("native", "/eo")
