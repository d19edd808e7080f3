"""``EoQueryOperator`` under ``dag.test()``: the task spark-submits a user's Structured Streaming
application whose query writes through ``KafkaExactlyOnceSink``, and ends with the query's run
in the ledger."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import HERE

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

TESTS = HERE.parents[1]


def test_the_query_task_runs_the_application_and_ends_with_its_run(
    airflow_env: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    source, sink = make_topic("ssa-src", partitions=2), make_topic("ssa-out", partitions=2)
    name = f"ssa-{uuid.uuid4().hex[:6]}"
    ledger_url = f"sqlite:///{airflow_env.home / 'ss-ledger.db'}"
    spec = {
        "name": name,
        "bootstrap": kafka_config["bootstrap.servers"],
        "source": source,
        "kind": "count",
        "checkpoint": str(airflow_env.home / "checkpoint"),
        "max_offsets": 40,
        "sink_ref": "eo_ss_sinks:SINK",
    }
    airflow_env.env.update(
        EO_SS_NAME=name,
        EO_SS_BOOTSTRAP=kafka_config["bootstrap.servers"],
        EO_SS_SINK=sink,
        EO_SS_LEDGER_URL=ledger_url,
        EO_SS_STAGING=str(airflow_env.home / "ss-staging"),
        EO_SS_APP=str(TESTS / "eo_ss_query.py"),
        EO_SS_SPEC=json.dumps(spec),
    )
    airflow_env.add_dag(TESTS / "eo_ss_sinks.py")
    airflow_env.add_dag(HERE / "dags" / "eo_ss_query_dag.py")
    producer = Producer(kafka_config)
    for i in range(100):
        producer.produce(source, key=f"k{i % 5}", value=str(i), partition=i % 2)
    assert producer.flush(30) == 0

    runs = airflow_env.run_dag_test("eo_ss_query_dag")
    assert runs[0]["tis"]["query"]["state"] == "success", runs
    run = runs[0]["xcoms"]["query"]  # the query's run, as the ledger has it
    assert run["state"] == "ENDED" and run["run_id"].startswith("af-query-") and run["pipeline"] == name

    with Ledger(ledger_url) as ledger:
        committed = [c for c in ledger.list_checkpoints(name) if c.state is CheckpointState.COMMITTED]
    assert [c.batch_id for c in committed] == [0, 1, 2] and sum(c.records or 0 for c in committed) == 15
    values = Counter(m.value().decode() for m in read_sink(kafka_config, sink))
    assert all(n == 1 for n in values.values()) and {f"k{i}=20" for i in range(5)} <= set(values)
