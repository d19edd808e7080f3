"""The arguments the four eo tasks share (operators/base.py)."""

from __future__ import annotations

import pytest

from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    parse_checkpoint_id,
)
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.plan import EoPlanOperator
from airflow_provider_eo.operators.submit import EoSubmitOperator
from airflow_provider_eo.sensors.checkpoint import EoCheckpointSensor
from airflow_provider_eo.version_compat import AirflowSkipException


@pytest.mark.parametrize("cls", [EoPlanOperator, EoSubmitOperator, EoCommitOperator])
def test_operators_share_the_pipeline_arguments(cls: type) -> None:
    assert issubclass(cls, PipelineTaskMixin)
    assert set(PIPELINE_TEMPLATE_FIELDS) <= set(cls.template_fields)


def test_sensor_shares_them_too() -> None:
    assert issubclass(EoCheckpointSensor, PipelineTaskMixin)
    sensor = EoCheckpointSensor(task_id="wait", pipeline="m:P", checkpoint_id="7", ledger_conn_id="c")
    assert (sensor.pipeline, sensor.checkpoint_id, sensor.kafka_conn_id, sensor.ledger_conn_id) == (
        "m:P",
        "7",
        None,
        "c",
    )
    assert sensor.target_checkpoint() == 7


def test_commit_stores_every_shared_argument() -> None:
    op = EoCommitOperator(
        task_id="commit", pipeline="m:P", checkpoint_id=3, kafka_conn_id="k", ledger_conn_id="l"
    )
    assert (op.pipeline, op.checkpoint_id, op.kafka_conn_id, op.ledger_conn_id) == ("m:P", 3, "k", "l")
    assert op.target_checkpoint() == 3


@pytest.mark.parametrize("value", [None, "", " None ", "None"])
def test_no_checkpoint_skips(value: object) -> None:
    with pytest.raises(AirflowSkipException, match="prepare: no checkpoint"):
        parse_checkpoint_id(value, task_id="prepare")


def test_bad_checkpoint_id_says_what_was_given() -> None:
    with pytest.raises(ValueError, match=r"checkpoint_id must be an integer.*'abc'"):
        parse_checkpoint_id("abc", task_id="prepare")


def test_pipeline_secrets_are_registered_with_the_task_log_masker() -> None:
    from airflow.sdk.log import redact

    from airflow_provider_eo.operators.base import mask_pipeline_secrets
    from airflow_provider_eo.pipeline import Pipeline

    pipeline = Pipeline(
        name="masked",
        kafka={
            "bootstrap.servers": "broker:9093",
            "sasl.password": "kafka-pw-8c1f",
            "ssl.key.password": "key-pw-77aa",
            "sasl.username": "svc-orders",
        },
        source_topics=["in"],
        sink_topic="out",
        ledger_url="postgresql+psycopg://eo:ledger-pw-5d2e@db:5432/eo",
    )
    line = (
        "url=postgresql+psycopg://eo:ledger-pw-5d2e@db:5432/eo sasl=kafka-pw-8c1f "
        "key=key-pw-77aa user=svc-orders"
    )
    assert redact(line) == line  # nothing registered yet
    mask_pipeline_secrets(pipeline)
    masked = str(redact(line))
    for secret in ("ledger-pw-5d2e", "kafka-pw-8c1f", "key-pw-77aa"):
        assert secret not in masked, masked
    assert "user=svc-orders" in masked and "db:5432" in masked
