"""Kafka error sorting of the transactional publisher."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from airflow_provider_eo.errors import CommitError, CommitFenced
from airflow_provider_eo.kafka.publisher import Abortable, ProducerLost, kafka_call


def _raiser(errors: list[KafkaError]) -> Any:
    def call() -> str:
        if errors:
            raise KafkaException(errors.pop(0))
        return "ok"

    return call


def test_retriable_is_repeated() -> None:
    errs = [KafkaError(KafkaError._TIMED_OUT, "t", retriable=True)] * 2
    assert kafka_call("x", _raiser(list(errs))) == "ok"


def test_retriable_until_deadline_is_producer_lost() -> None:
    errs = [KafkaError(KafkaError._TIMED_OUT, "t", retriable=True)] * 100
    with pytest.raises(ProducerLost):
        kafka_call("commit_transaction", _raiser(errs), deadline_s=0.3)


def test_abortable_and_fatal_and_unknown() -> None:
    with pytest.raises(Abortable):
        kafka_call("x", _raiser([KafkaError(KafkaError._STATE, "s", txn_requires_abort=True)]))
    with pytest.raises(CommitFenced, match="fenced"):
        kafka_call("x", _raiser([KafkaError(KafkaError._FENCED, "f", fatal=True)]))
    with pytest.raises(CommitError, match="unclassified"):
        kafka_call("x", _raiser([KafkaError(KafkaError.UNKNOWN, "u")]))
