"""One filesystem layer for staging: every process that reads, writes, lists or removes staged
files opens ``staging_dir`` here, the way Spark's Hadoop side opens it.

A location is a local folder or a URI. Hadoop's object-store schemes are mapped to pyarrow's
filesystems: ``s3a://``, ``s3://`` and ``s3n://`` to :class:`pyarrow.fs.S3FileSystem` (the same
bucket and key; Spark needs ``s3a://``, vanilla Hadoop has no ``s3://``), ``gs://`` to
:class:`pyarrow.fs.GcsFileSystem`, ``abfss://``/``abfs://`` to pyarrow's ``AzureFileSystem``
and ``hdfs://`` to :class:`pyarrow.fs.HadoopFileSystem` where Hadoop's native client is
installed, else to the NameNode's WebHDFS (:func:`hdfs_filesystem`).

S3 settings come from one precedence, setting by setting (endpoint, region, path-style
access, TLS; the credentials as one set: key id, secret and session token together):

1. the pipeline's ``spark_conf``: ``spark.hadoop.fs.s3a.bucket.<bucket>.<key>`` then
   ``spark.hadoop.fs.s3a.<key>`` (``endpoint``, ``endpoint.region``, ``path.style.access``,
   ``connection.ssl.enabled``, ``access.key``/``secret.key``/``session.token``), what
   Hadoop's S3A reads in the Spark job;
2. this process's standard AWS environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
   ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL_S3`` then ``AWS_ENDPOINT_URL``, ``AWS_REGION``
   then ``AWS_DEFAULT_REGION``;
3. the Airflow connection named by ``Pipeline(aws_conn_id=...)`` (read by the Amazon
   provider's hooks where the connections are read: :mod:`airflow_provider_eo.connections`);
4. otherwise the AWS SDK's own default chain (profiles, instance or pod roles) on both sides.

The Spark side gets the same answer without any secret in Spark conf: a setting that is not
a secret (endpoint, region, path style, TLS) and came from 2 or 3 is added to the Spark conf
of a session eo starts (:func:`spark_settings`) unless the pipeline set it; credentials from
the environment reach Hadoop through its default credential chain (the JVM inherits this
process's environment), credentials from a connection through the environment of the JVM
eo starts (:func:`jvm_environment`), never through Spark conf, XCom or a log line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from airflow_provider_eo.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_eo.pipeline import Pipeline

__all__ = [
    "S3_SCHEMES",
    "WEBHDFS_DEFAULT_PORT",
    "S3Settings",
    "StagingStore",
    "hdfs_filesystem",
    "is_s3_location",
    "jvm_environment",
    "spark_settings",
    "store_for",
    "uses_s3",
    "with_store",
]

#: Hadoop's names for S3, all read through pyarrow's S3 filesystem.
S3_SCHEMES = ("s3a", "s3", "s3n")
_AZURE_SCHEMES = ("abfss", "abfs")
_S3A = "spark.hadoop.fs.s3a."
#: S3A keys (after ``fs.s3a.``) that are secrets: never written by eo into Spark conf.
_SECRET_KEYS = ("access.key", "secret.key", "session.token")
_ENV_ENDPOINTS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_ENV_REGIONS = ("AWS_REGION", "AWS_DEFAULT_REGION")


def _flag(value: str | None) -> bool | None:
    if value is None or str(value).strip() == "":
        return None
    return str(value).strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class S3Settings:
    """The S3 settings one staging location is opened with (secrets never in ``repr``).

    :param endpoint: the endpoint URL or ``host[:port]``; None: AWS's.
    :param region: the signing region; None: pyarrow's default.
    :param path_style: path-style access (``fs.s3a.path.style.access``); None: default.
    :param ssl: TLS to the endpoint (``fs.s3a.connection.ssl.enabled``); None: from the URL.
    :param access_key: the key id, with ``secret_key`` (and ``session_token``); None: the
        AWS SDK's default chain.
    :param credentials_from: where the credentials came from (for messages): ``spark_conf``,
        ``environment``, ``connection <id>`` or ``default chain``.
    """

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    ssl: bool | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    credentials_from: str = "default chain"
    #: Where each non-secret setting came from: ``{"endpoint": "environment", ...}``.
    origins: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """The settings without secrets, for messages."""
        parts = [f"credentials from {self.credentials_from}"]
        for name in ("endpoint", "region", "path_style", "ssl"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value}")
        return ", ".join(parts)

    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's S3 filesystem with these settings."""
        kwargs: dict[str, Any] = {}
        if self.access_key and self.secret_key:
            kwargs.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        if self.endpoint:
            parsed = urlsplit(self.endpoint if "://" in self.endpoint else f"//{self.endpoint}")
            kwargs["endpoint_override"] = parsed.netloc or self.endpoint
            scheme = parsed.scheme or "https"
            if self.ssl is not None:
                scheme = "https" if self.ssl else "http"
            kwargs["scheme"] = scheme
            # A custom endpoint signs with whatever region it is given; AWS's default one.
            kwargs["region"] = self.region or "us-east-1"
        elif self.region:
            kwargs["region"] = self.region
        if self.ssl is not None and "scheme" not in kwargs:
            kwargs["scheme"] = "https" if self.ssl else "http"
        if self.path_style is not None:
            kwargs["force_virtual_addressing"] = not self.path_style
        return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True)
class StagingStore:
    """How one pipeline's staging locations are opened: frozen and picklable, so a Spark task
    that reads staged files (the distributed commit) opens them as the driver does.

    :param s3: the S3 settings (see the module docstring), resolved per bucket.
    :param by_bucket: per-bucket settings (``spark.hadoop.fs.s3a.bucket.<bucket>.*``) over ``s3``.
    """

    s3: S3Settings = field(default_factory=S3Settings)
    by_bucket: tuple[tuple[str, S3Settings], ...] = ()

    def s3_for(self, bucket: str) -> S3Settings:
        """The settings of ``bucket``."""
        return next((s for b, s in self.by_bucket if b == bucket), self.s3)

    def open(self, location: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem of ``location`` and the path within it (local paths absolute)."""
        if "://" not in location:
            return pafs.LocalFileSystem(), os.path.abspath(location)
        scheme, rest = location.split("://", 1)
        scheme = scheme.lower()
        if scheme in S3_SCHEMES:
            bucket = rest.split("/", 1)[0]
            if not bucket:
                raise ConfigError(f"staging location {location!r} names no bucket ({scheme}://BUCKET/PATH)")
            return self.s3_for(bucket).filesystem(), rest.rstrip("/")
        if scheme in _AZURE_SCHEMES:
            return _azure(location)
        if scheme == "hdfs":
            return hdfs_filesystem(location)
        if scheme == "gs":
            fs, path = pafs.FileSystem.from_uri(location)
            return fs, path.rstrip("/")
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path


def _hadoop_conf_dirs() -> list[Path]:
    """Where a Hadoop client finds its ``*-site.xml`` files, first match wins:
    ``HADOOP_CONF_DIR``, the folder Spark ships them in to a YARN container, and
    ``$HADOOP_HOME/etc/hadoop``."""
    dirs = [os.environ.get("HADOOP_CONF_DIR"), os.path.join("__spark_conf__", "__hadoop_conf__")]
    if os.environ.get("HADOOP_HOME"):
        dirs.append(os.path.join(os.environ["HADOOP_HOME"], "etc", "hadoop"))
    return [Path(d) for d in dirs if d]


def _hadoop_setting(key: str) -> str | None:
    """``key`` from the first ``hdfs-site.xml`` of :func:`_hadoop_conf_dirs` that sets it."""
    import xml.etree.ElementTree as ET

    for folder in _hadoop_conf_dirs():
        site = folder / "hdfs-site.xml"
        if not site.is_file():
            continue
        for prop in ET.parse(site).getroot().iter("property"):
            if prop.findtext("name") == key:
                return (prop.findtext("value") or "").strip() or None
    return None


#: WebHDFS's port when ``dfs.namenode.http-address`` is not configured (Hadoop 3's default).
WEBHDFS_DEFAULT_PORT = 9870


def hdfs_filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """``hdfs://NAMENODE[:PORT]/PATH``: through Hadoop's native client (pyarrow's
    :class:`~pyarrow.fs.HadoopFileSystem`, which needs ``libhdfs`` and a JVM: used when
    ``ARROW_LIBHDFS_DIR`` or ``HADOOP_HOME`` says where ``libhdfs`` is), else through the
    NameNode's WebHDFS REST API (pure Python, fsspec's ``WebHDFS``), at
    ``dfs.namenode.http-address`` of the Hadoop configuration (``HADOOP_CONF_DIR``, or the one
    Spark ships to a YARN container), or port 9870 of the same host. Either way the same files
    Spark's Hadoop side writes under that URI, as the same user (``HADOOP_USER_NAME``, else
    this process's user, as Hadoop's simple authentication does)."""
    parsed = urlsplit(location)
    path = parsed.path.rstrip("/") or "/"
    if os.environ.get("ARROW_LIBHDFS_DIR") or os.environ.get("HADOOP_HOME"):
        fs, native_path = pafs.FileSystem.from_uri(location)
        return fs, native_path
    import getpass

    from fsspec.implementations.webhdfs import WebHDFS

    host = parsed.hostname or ""
    if not host:
        raise ConfigError(f"staging location {location!r} names no NameNode (hdfs://NAMENODE:PORT/PATH)")
    http = _hadoop_setting("dfs.namenode.http-address")
    http_host, port = host, WEBHDFS_DEFAULT_PORT
    if http:
        configured_host, _, configured_port = http.rpartition(":")
        port = int(configured_port)
        if configured_host not in ("", "0.0.0.0"):
            http_host = configured_host
    user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
    webhdfs = WebHDFS(http_host, port=port, user=user)
    return pafs.PyFileSystem(pafs.FSSpecHandler(webhdfs)), path


def _azure(location: str) -> tuple[pafs.FileSystem, str]:
    """``abfss://container@account.dfs.core.windows.net/path`` through pyarrow's
    AzureFileSystem (credentials: its default chain, ``AZURE_*`` environment)."""
    azure = getattr(pafs, "AzureFileSystem", None)
    if azure is None:
        raise ConfigError(
            f"staging location {location!r}: this pyarrow has no AzureFileSystem; install a "
            "pyarrow built with Azure support (the PyPI wheels have it from pyarrow 16 on)"
        )
    parsed = urlsplit(location)
    container, _, host = (parsed.netloc or "").partition("@")
    account = host.split(".", 1)[0]
    if not container or not account:
        raise ConfigError(
            f"staging location {location!r}: give it as abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
        )
    return azure(account_name=account), f"{container}{parsed.path}".rstrip("/")


def _from_spark_conf(conf: Mapping[str, str], prefix: str) -> dict[str, str]:
    return {k[len(prefix) :]: str(v) for k, v in conf.items() if k.startswith(prefix)}


def _layer(
    keys: Mapping[str, str], env: Mapping[str, str], connection: Mapping[str, str], conn_id: str | None
) -> S3Settings:
    """Apply the precedence to one set of ``fs.s3a.*`` keys (global or one bucket's)."""
    origins: dict[str, str] = {}
    values: dict[str, Any] = {}
    env_values = {
        "endpoint": next((env[k] for k in _ENV_ENDPOINTS if env.get(k)), None),
        "region": next((env[k] for k in _ENV_REGIONS if env.get(k)), None),
    }
    conn_label = f"connection {conn_id!r}" if conn_id else "connection"
    for name, key in (("endpoint", "endpoint"), ("region", "endpoint.region")):
        for origin, value in (
            ("spark_conf", keys.get(key)),
            ("environment", env_values[name]),
            (conn_label, connection.get(name)),
        ):
            if value:
                values[name], origins[name] = value, origin
                break
    for name, key in (("path_style", "path.style.access"), ("ssl", "connection.ssl.enabled")):
        for origin, value in (("spark_conf", keys.get(key)), (conn_label, connection.get(name))):
            flag = _flag(value)
            if flag is not None:
                values[name], origins[name] = flag, origin
                break
    creds_from = "default chain"
    for origin, (key_id, secret, token) in (
        ("spark_conf", (keys.get("access.key"), keys.get("secret.key"), keys.get("session.token"))),
        (
            "environment",
            (env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN")),
        ),
        (
            conn_label,
            (connection.get("access_key"), connection.get("secret_key"), connection.get("session_token")),
        ),
    ):
        if key_id and secret:
            values.update(access_key=key_id, secret_key=secret, session_token=token or None)
            creds_from = origin
            break
    return S3Settings(**values, credentials_from=creds_from, origins=tuple(sorted(origins.items())))


def store_for(
    pipeline: Pipeline,
    *,
    environ: Mapping[str, str] | None = None,
) -> StagingStore:
    """The staging store of ``pipeline`` in this process (see the module docstring for the
    precedence). ``environ`` defaults to this process's environment."""
    env = os.environ if environ is None else environ
    conf = pipeline.spark_conf
    connection = {k: str(v) for k, v in (pipeline.aws_settings or {}).items() if v is not None}
    conn_id = connection.pop("conn_id", None)
    base_keys = {k: v for k, v in _from_spark_conf(conf, _S3A).items() if not k.startswith("bucket.")}
    s3 = _layer(base_keys, env, connection, conn_id)
    buckets: dict[str, dict[str, str]] = {}
    for key, value in _from_spark_conf(conf, f"{_S3A}bucket.").items():
        bucket, _, rest = key.partition(".")
        if rest:
            buckets.setdefault(bucket, {})[rest] = value
    by_bucket = tuple(
        (bucket, _layer({**base_keys, **keys}, env, connection, conn_id))
        for bucket, keys in sorted(buckets.items())
    )
    return StagingStore(s3=s3, by_bucket=by_bucket)


def is_s3_location(location: str | None) -> bool:
    """Whether ``location`` is under an S3 scheme (``s3a://``, ``s3://``, ``s3n://``)."""
    if not location or "://" not in location:
        return False
    return location.split("://", 1)[0].lower() in S3_SCHEMES


def uses_s3(pipeline: Pipeline) -> bool:
    """Whether the pipeline stages under an S3 scheme."""
    return is_s3_location(pipeline.staging_dir)


def spark_settings(pipeline: Pipeline, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """``conf`` (default: the pipeline's ``spark_conf``) with the non-secret S3 settings that
    came from the environment or a connection added as ``spark.hadoop.fs.s3a.*`` where it
    has none, so Hadoop's S3A opens the staging bucket where pyarrow does. Secrets are never
    added: see :func:`jvm_environment`."""
    out = dict(pipeline.spark_conf if conf is None else conf)
    if not uses_s3(pipeline):
        return out
    s3 = store_for(pipeline).s3
    origins = dict(s3.origins)
    derived = {
        "endpoint": s3.endpoint,
        "endpoint.region": s3.region,
        "path.style.access": None if s3.path_style is None else str(s3.path_style).lower(),
        "connection.ssl.enabled": None if s3.ssl is None else str(s3.ssl).lower(),
    }
    names = {"endpoint": "endpoint", "endpoint.region": "region", "path.style.access": "path_style"}
    names["connection.ssl.enabled"] = "ssl"
    for key, value in derived.items():
        if value is None or origins.get(names[key]) == "spark_conf":
            continue
        out.setdefault(f"{_S3A}{key}", value)
    endpoint = s3.endpoint or ""
    if s3.ssl is None and endpoint.startswith("http://") and f"{_S3A}connection.ssl.enabled" not in out:
        out[f"{_S3A}connection.ssl.enabled"] = "false"
    if s3.credentials_from not in ("spark_conf", "default chain"):
        # Hadoop's default chain reads AWS_* of the JVM's environment; say so explicitly
        # unless the pipeline chose its providers itself.
        out.setdefault(f"{_S3A}aws.credentials.provider", _ENV_PROVIDER)
    return out


_ENV_PROVIDER = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"


def jvm_environment(pipeline: Pipeline) -> dict[str, str]:
    """The AWS environment a JVM eo starts for ``pipeline`` must get so that Hadoop's S3A
    uses the credentials pyarrow uses: empty unless they came from an Airflow connection
    (from the environment, the JVM inherits them; from ``spark_conf``, Hadoop reads them
    there)."""
    if not uses_s3(pipeline):
        return {}
    s3 = store_for(pipeline).s3
    if not s3.credentials_from.startswith("connection") or not (s3.access_key and s3.secret_key):
        return {}
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    if s3.session_token:
        env["AWS_SESSION_TOKEN"] = s3.session_token
    return env


def with_store(store: StagingStore | None) -> StagingStore:
    """``store``, or the store of a caller that has no pipeline at hand: S3 settings from
    this process's AWS environment only."""
    return store if store is not None else StagingStore(s3=_layer({}, os.environ, {}, None))
