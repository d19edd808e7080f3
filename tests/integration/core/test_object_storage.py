"""Staging on object storage, end to end: an S3-compatible server (moto's, started here on
127.0.0.1 with IAM authentication on) and Hadoop's S3A connector in Spark (``hadoop-aws`` at
pyspark's Hadoop version with its AWS SDK bundle, fetched from Maven Central by the bootstrap).

Every pipeline stages under ``s3a://``; each Spark job runs in an ``eo`` child process (its
own JVM, with the S3A jars), so the credentials each test gives reach exactly what a user's
would: the child's ``AWS_*`` environment, or the pipeline's ``spark.hadoop.fs.s3a.*``. Each
test counts exactly-once against the source (a read_committed read of the sink against the
records produced) and the audit, lists the bucket with its own client while a checkpoint is
PREPARED, and checks that nothing was staged on local disk.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eo_harness import EO, Harness, poll_until

from airflow_provider_eo import names
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

BUCKET = "eo-staging"
S3A = "spark.hadoop.fs.s3a."
TESTS = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class S3Server:
    """moto's server on 127.0.0.1: one IAM user whose key may do anything on S3."""

    endpoint: str
    access_key: str
    secret_key: str

    def client(self, secret: str | None = None) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret or self.secret_key,
            config=Config(s3={"addressing_style": "path"}),
        )

    def keys(self, prefix: str) -> list[str]:
        """Every object key under ``prefix`` in the staging bucket (listed here, not by eo)."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def env(self) -> dict[str, str]:
        """The standard AWS environment of a process that reaches this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def spark_conf(self) -> dict[str, str]:
        """The same as ``spark.hadoop.fs.s3a.*`` settings (credentials included)."""
        return {
            f"{S3A}endpoint": self.endpoint,
            f"{S3A}endpoint.region": "us-east-1",
            f"{S3A}access.key": self.access_key,
            f"{S3A}secret.key": self.secret_key,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's server on a free port, IAM authentication on after the 4 set-up calls (a user,
    its key, its policy, the bucket); stopped at the end of the module."""
    import boto3

    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def listening() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            with socket.socket() as s:  # a TCP connect, not a request: requests are counted
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert poll_until(listening, timeout=60), log.read_text()[-3000:]
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="eo")
        key = iam.create_access_key(UserName="eo")["AccessKey"]
        iam.put_user_policy(
            UserName="eo",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        server = S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.fixture(scope="module")
def s3a_jars() -> str:
    """Spark's classpath for these pipelines: the Kafka connector and eo's jar, and
    Hadoop's S3A connector with its AWS SDK bundle."""
    from airflow_provider_eo.spark.session import connector_jars_csv
    from airflow_provider_eo.stack.maven import hadoop_aws_jars

    return ",".join([connector_jars_csv(), *(str(p) for p in hadoop_aws_jars())])


class S3Harness(Harness):
    """A :class:`Harness` whose ``eo`` children run in their own folder with exactly the
    AWS environment a test gives (none of this process's)."""

    def __init__(
        self, pipeline: Pipeline, config: dict[str, Any], cwd: Path, aws_env: dict[str, str]
    ) -> None:
        super().__init__(pipeline, config, None)
        self.cwd = cwd
        self.aws_env = aws_env
        self.produced: list[str] = []

    def produce(self, n: int, *, keys: int = 7, start: int = 0, txn: str | None = None) -> None:
        super().produce(n, keys=keys, start=start, txn=txn)
        self.produced += [f"k{i % keys}:{i}" for i in range(start, start + n)]

    def child_env(self, fault: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "EO_FAULT"}
        env.update(self.aws_env)
        env["EO_TEST_PIPELINE_JSON"] = self.pipeline.to_json()
        env["EO_SPARK_LOG_LEVEL"] = "ERROR"
        if fault:
            env["EO_FAULT"], env["EO_FAULT_ACTION"] = fault, "kill"
        return env

    def eo(
        self, *args: str, fault: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        cmd = [EO, *args, "eo_test_pipelines:from_env", "--json"]
        return subprocess.run(
            cmd,
            env=self.child_env(fault),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def assert_exactly_once_against_source(self) -> None:
        """Every produced record once in the sink (read_committed), nothing else; the audit agrees."""
        sink = Counter(m.value().decode() for m in read_sink(self.config, self.pipeline.sink_topic))
        assert sink == Counter(self.produced), (
            f"{sum(sink.values())} sink records for {len(self.produced)} produced; "
            f"duplicated {[v for v, n in sink.items() if n > 1][:5]}, "
            f"missing {sorted(set(self.produced) - set(sink))[:5]}"
        )
        self.assert_exactly_once(expected_records=len(self.produced))

    def assert_nothing_staged_locally(self) -> None:
        local = [
            p for p in self.cwd.rglob("*") if p.name.startswith(("cp-", "attempt-")) or p.name == "staging"
        ]
        assert not local, local
        pinned = self.ledger.get_pipeline(self.pipeline.name).staging_dir
        assert pinned is not None and pinned.startswith(f"s3a://{BUCKET}/"), pinned


@pytest.fixture()
def s3_harness(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], s3: S3Server, s3a_jars: str
) -> Iterator[Callable[..., S3Harness]]:
    made: list[S3Harness] = []

    def _make(
        *, credentials: str, source_partitions: int = 2, sink_partitions: int = 2, **kw: Any
    ) -> S3Harness:
        spark_conf = {"spark.jars": s3a_jars, f"{S3A}path.style.access": "true"}
        aws_env: dict[str, str] = {}
        if credentials == "environment":
            aws_env = s3.env()
        elif credentials == "spark_conf":
            spark_conf.update(s3.spark_conf())
        elif credentials == "wrong":
            aws_env = {**s3.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        spark_conf.update(kw.pop("spark_conf", {}))
        name = f"s3-{uuid.uuid4().hex[:8]}"
        pipeline = Pipeline(
            name=name,
            kafka=dict(kafka_config),
            source_topics=[make_topic("src", partitions=source_partitions)],
            sink_topic=make_topic("sink", partitions=sink_partitions),
            transform="eo_test_transforms:identity",
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=f"s3a://{BUCKET}/{name}/staging",
            spark_conf=spark_conf,
            **kw,
        )
        work = tmp_path / "work"
        work.mkdir(exist_ok=True)
        h = S3Harness(pipeline, dict(kafka_config), work, aws_env)
        made.append(h)
        return h

    yield _make
    for h in made:
        h.ledger.close()


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_run_once_through_sigkills_stages_in_the_bucket_with_credentials_from_the_environment(
    s3_harness: Callable[..., S3Harness], s3: S3Server
) -> None:
    h = s3_harness(credentials="environment", commit_shards=2, commit_mode="local")
    h.produce(300)
    prefix = f"{h.pipeline.name}/staging/{h.pipeline.name}/cp-"
    # Killed after Spark wrote the staged files, before the manifest: PLANNED, a dead attempt.
    killed = h.eo("run-once", fault="prepare.after_write")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state is CheckpointState.PLANNED
    dead = s3.keys(prefix)
    assert any(k.endswith(".parquet") for k in dead) and not any(
        k.endswith(f"/{names.MANIFEST}") for k in dead
    ), dead

    # Killed inside the commit's transaction: PREPARED, its staged output only in the bucket.
    killed = h.eo("run-once", fault="commit.before_commit_txn")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    cp = h.ledger.get(h.pipeline.name, cp.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED and cp.staging_location is not None
    assert cp.staging_location.startswith(f"s3a://{BUCKET}/"), cp.staging_location
    attempt = cp.staging_location.split(f"s3a://{BUCKET}/", 1)[1]
    staged = s3.keys(attempt + "/")
    assert f"{attempt}/{names.MANIFEST}" in staged, staged
    assert sum(k.endswith(".parquet") for k in staged) >= 1, staged
    h.assert_nothing_staged_locally()

    # The retry commits what the bucket holds, then removes the checkpoint's staging (the
    # dead attempt's too).
    done = h.eo("run-once")
    assert done.returncode == 0, done.stderr[-3000:]
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.COMMITTED
    h.assert_exactly_once_against_source()
    assert s3.keys(prefix) == [], s3.keys(prefix)
    h.assert_nothing_staged_locally()


def test_distributed_commit_and_doctor_with_credentials_from_spark_conf(
    s3_harness: Callable[..., S3Harness], s3: S3Server
) -> None:
    # No AWS_* anywhere in the children: the executors' commit tasks read the staged files
    # with the settings the committable carries.
    h = s3_harness(credentials="spark_conf", commit_shards=2, commit_mode="spark", keep_committed_staging=1)
    h.produce(200)
    done = h.eo("run-once")
    assert done.returncode == 0, done.stderr[-3000:]
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state is CheckpointState.COMMITTED
    assert "spark" in json.dumps(_json_lines(done.stdout)), done.stdout[-2000:]
    h.assert_exactly_once_against_source()
    kept = s3.keys(f"{h.pipeline.name}/staging/")
    assert any(k.endswith(f"/{names.MANIFEST}") for k in kept), kept  # keep_committed_staging=1
    h.assert_nothing_staged_locally()

    doctor = h.eo("doctor")
    report = json.loads(doctor.stdout.strip().splitlines()[-1])
    findings = {f["check"]: f for f in report["findings"]}
    assert findings["staging"]["severity"] == "ok", findings["staging"]
    assert findings["staging shared"]["severity"] == "ok", findings["staging shared"]
    assert not [k for k in s3.keys(f"{h.pipeline.name}/") if ".eo-doctor" in k]  # probes removed


def test_stream_stages_every_checkpoint_in_the_bucket(
    s3_harness: Callable[..., S3Harness], s3: S3Server
) -> None:
    h = s3_harness(credentials="environment", max_records_per_checkpoint=60)
    h.produce(180)
    run = h.eo("stream", "--interval", "0.5", "--checkpoints", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    committed = [
        c for c in h.ledger.list_checkpoints(h.pipeline.name) if c.state is CheckpointState.COMMITTED
    ]
    assert len(committed) == 3, committed
    assert all((c.staging_location or "").startswith(f"s3a://{BUCKET}/") for c in committed)
    h.assert_exactly_once_against_source()
    h.assert_nothing_staged_locally()


def test_structured_streaming_sink_stages_in_the_bucket(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], s3: S3Server, s3a_jars: str
) -> None:
    source, sink_topic = make_topic("ss-src", partitions=2), make_topic("ss-sink", partitions=2)
    name = f"ss-{uuid.uuid4().hex[:8]}"
    h = S3Harness(
        Pipeline(
            name=name,
            kafka=dict(kafka_config),
            source_topics=[source],
            sink_topic=sink_topic,
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=f"s3a://{BUCKET}/{name}/staging",
        ),
        dict(kafka_config),
        tmp_path,
        s3.env(),
    )
    h.produce(120)
    spec = {
        "bootstrap": kafka_config["bootstrap.servers"],
        "source": source,
        "sink": sink_topic,
        "name": name,
        "ledger_url": h.pipeline.ledger_url,
        "staging_dir": h.pipeline.staging_dir,
        "checkpoint": str(tmp_path / "query-checkpoint"),
        "kind": "identity",
        "max_offsets": 50,
        "spark_conf": {
            "spark.jars": s3a_jars,
            f"{S3A}path.style.access": "true",
            f"{S3A}endpoint": s3.endpoint,
        },
    }
    run = subprocess.run(
        [sys.executable, str(TESTS / "eo_ss_query.py"), json.dumps(spec)],
        env=h.child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with h.ledger as ledger:
        committed = [c for c in ledger.list_checkpoints(name) if c.state is CheckpointState.COMMITTED]
    assert len(committed) >= 3, committed  # 120 records, 50 per trigger
    assert all((c.staging_location or "").startswith(f"s3a://{BUCKET}/") for c in committed)
    sink = Counter(m.value().decode() for m in read_sink(h.config, sink_topic))
    assert sink == Counter(h.produced), (sum(sink.values()), len(h.produced))
    assert not (tmp_path / ".eo" / "staging").exists()


def test_a_wrong_credential_fails_the_prepare_naming_staging_dir(
    s3_harness: Callable[..., S3Harness], s3: S3Server
) -> None:
    h = s3_harness(credentials="wrong")
    h.produce(20)
    run = h.eo("run-once")
    assert run.returncode != 0
    said = " ".join(run.stderr.split())  # the console wraps long lines
    assert f"staging_dir '{h.pipeline.staging_dir}' cannot be listed" in said, said[-3000:]
    assert "credentials from environment" in said and "SIGNATURE_DOES_NOT_MATCH" in said, said[-3000:]
    assert "not-the-secret" not in run.stderr + run.stdout
    assert s3.keys(f"{h.pipeline.name}/") == []
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state is CheckpointState.PLANNED  # nothing staged, nothing published
    assert read_sink(h.config, h.pipeline.sink_topic) == []

    doctor = h.eo("doctor", "--no-spark-probe")
    report = json.loads(doctor.stdout.strip().splitlines()[-1])
    (staging,) = [f for f in report["findings"] if f["check"] == "staging"]
    assert staging["severity"] == "fail", staging
    assert "credentials from environment" in staging["found"], staging
    assert "not-the-secret" not in doctor.stdout + doctor.stderr
