"""What the operators hand spark-submit for a Kubernetes master (no cluster runs here): the
driver runs in a pod, so every file must be in its image (``local://``) or uploaded to
``spark.kubernetes.file.upload.path``; connections travel as ids, never as secrets."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_eo import names
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.submit import EoSubmitOperator
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.version_compat import AirflowFailException

CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
MASTER = "k8s://https://kubernetes.example:6443"
UPLOAD = "s3a://spark-uploads/eo"
IMAGE_APP = "local:///opt/venv/lib/python3.11/site-packages/airflow_provider_eo/apps/prepare.py"


@pytest.fixture()
def k8s(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.providers.apache.spark.hooks.spark_submit as hook_mod

    # The Kubernetes provider is not installed here; the hook only checks it is importable
    # (its client is used for driver-pod tracking, which these tests do not reach).
    monkeypatch.setattr(hook_mod, "kube_client", SimpleNamespace(), raising=False)
    host, port = MASTER.rsplit(":", 1)
    conn = {"conn_type": "spark", "host": host, "port": int(port), "extra": {"namespace": "etl"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S", json.dumps(conn))
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_KAFKA",
        json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": "b:9092", "sasl.password": "k8s-s3cret"}}
        ),
    )


def _planned(pipeline_ref: str) -> Any:
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    return pipeline


def _commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    commands: list[list[str]] = []

    def submit(hook: SparkSubmitHook, application: str = "", **kwargs: Any) -> None:
        commands.append(hook._build_spark_submit_command(application))

    monkeypatch.setattr(SparkSubmitHook, "submit", submit)
    return commands


def _conf(command: list[str]) -> dict[str, str]:
    return dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _prepare(pipeline_ref: str, **kwargs: Any) -> EoSubmitOperator:
    return EoSubmitOperator(
        task_id="prepare",
        pipeline=pipeline_ref,
        checkpoint_id="1",
        conn_id="spark_k8s",
        deploy_mode="cluster",
        packages=CONNECTOR,
        kafka_conn_id="eo_kafka",
        durable=False,
        **kwargs,
    )


def test_cluster_mode_with_an_upload_path_submits_the_worker_files_for_upload(
    k8s: None, pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    _planned(pipeline_ref)
    commands = _commands(monkeypatch)
    op = _prepare(pipeline_ref, conf={"spark.kubernetes.file.upload.path": UPLOAD}, env_vars={"TZ": "UTC"})
    with pytest.raises(Exception, match="finished but checkpoint 1 is PLANNED"):
        op.execute(context)  # nothing ran the driver here

    (command,) = commands
    conf = _conf(command)
    assert _arg(command, "--master") == MASTER and _arg(command, "--deploy-mode") == "cluster"
    assert conf["spark.kubernetes.file.upload.path"] == UPLOAD
    assert conf["spark.kubernetes.namespace"] == "etl"
    # The provider's application and the pipeline's module are this worker's files: spark-submit
    # uploads them to the upload path, and the pod's driver fetches them from there.
    app_index = next(
        i for i, arg in enumerate(command) if arg.endswith("airflow_provider_eo/apps/prepare.py")
    )
    assert not command[app_index].startswith("local://")
    assert str(tmp_path) in _arg(command, "--py-files")
    assert _arg(command, "--packages") == CONNECTOR
    # The driver's environment goes to the pod (driverEnv); the connection by id, no hand-off.
    assert conf["spark.kubernetes.driverEnv.TZ"] == "UTC"
    assert not any(k.endswith(names.CONNECTIONS_FILE_ENV) for k in conf)
    args = command[app_index + 1 :]
    assert args[args.index("--kafka-conn-id") + 1] == "eo_kafka"
    assert "k8s-s3cret" not in json.dumps(command)


def test_cluster_mode_refuses_worker_files_without_an_upload_path(
    k8s: None, pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _planned(pipeline_ref)
    commands = _commands(monkeypatch)
    with pytest.raises(
        AirflowFailException, match=r"spark\.kubernetes\.file\.upload\.path.*local:///PATH"
    ) as err:
        _prepare(pipeline_ref).execute(context)
    assert "apps/prepare.py" in str(err.value) and "Nothing was submitted" in str(err.value)
    assert commands == []


def test_cluster_mode_with_everything_in_the_image_needs_no_upload_path(
    k8s: None, pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application given as local:// inside the image and the pipeline module installed
    there (nothing shipped): submitted as given."""
    import airflow_provider_eo.operators.submit as submit_mod

    _planned(pipeline_ref)
    commands = _commands(monkeypatch)
    monkeypatch.setattr(submit_mod, "ship_py_files", lambda refs: [])
    op = _prepare(pipeline_ref, application=IMAGE_APP)
    with pytest.raises(Exception, match="finished but checkpoint 1 is PLANNED"):
        op.execute(context)
    (command,) = commands
    assert IMAGE_APP in command and "--py-files" not in command
    assert "spark.kubernetes.file.upload.path" not in _conf(command)


def test_client_mode_on_kubernetes_needs_no_upload_path(
    k8s: None, pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client deploy mode: the driver is the task's child and reads this worker's files."""
    _planned(pipeline_ref)
    commands = _commands(monkeypatch)
    op = EoSubmitOperator(
        task_id="prepare",
        pipeline=pipeline_ref,
        checkpoint_id="1",
        conn_id="spark_k8s",
        deploy_mode="client",
        packages=CONNECTOR,
    )
    with pytest.raises(Exception, match="finished but checkpoint 1 is PLANNED"):
        op.execute(context)
    (command,) = commands
    assert _arg(command, "--deploy-mode") == "client"


def test_the_spark_commit_on_kubernetes_is_checked_the_same_way(
    k8s: None, pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = _planned(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )
    commands = _commands(monkeypatch)
    op = EoCommitOperator(
        task_id="commit",
        pipeline=pipeline_ref,
        checkpoint_id="1",
        commit_mode="spark",
        conn_id="spark_k8s",
        deploy_mode="cluster",
        durable=False,
    )
    with pytest.raises(AirflowFailException, match=r"spark\.kubernetes\.file\.upload\.path"):
        op.execute(context)
    assert commands == []
