"""Metrics and notifications in a real run: one ``dag.test()`` of the example pipeline DAG
with Airflow's StatsD backend on (InfluxDB tag mode) pointed at a UDP listener on
127.0.0.1, and a pipeline whose transform sends poison records to a dead-letter topic and
whose ``dead_letters`` notifier (an Airflow ``BaseNotifier``) writes a file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import poll_until
from eo_statsd import statsd_env, statsd_listener

from airflow_provider_eo.demo.sample import produce_sample
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

# One poison record on each of two partitions: 2 dead letters, over the notifier's threshold 1.
POISON_PARTITIONS = (0, 1)

# Replaces the DAG folder's eo_demo_pipelines.py: the example pipeline plus a dead-letter
# topic, and a notifier for dead letters that writes what it gets to a file.
_PIPELINES = '''
import dataclasses
import json
import os

from airflow.sdk import BaseNotifier

from eo_demo_base import demo_pipeline as base_pipeline


class FileNotifier(BaseNotifier):
    """Appends context["eo"] (and a rendered template) to a file, one JSON line each."""

    template_fields = ("message",)

    def __init__(self, path, message):
        super().__init__()
        self.path = path
        self.message = message

    def notify(self, context):
        line = {**context["eo"], "message": self.message, "ti_task_id": context["ti"].task_id}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\\n")


def demo_pipeline(env=None):
    env = os.environ if env is None else env
    return dataclasses.replace(
        base_pipeline(env),
        dead_letter_topic=env["EO_TEST_DLQ"],
        max_dead_letters_per_checkpoint=100,
        notifiers={
            "dead_letters": [
                FileNotifier(env["EO_TEST_NOTIFY_FILE"], "{{ eo.pipeline }}: {{ eo.dead_letters }} dead"),
            ],
        },
        notify_dead_letters_above=1,
    )
'''


def test_one_run_sends_the_eo_metrics_and_notifies_dead_letters(
    airflow_env: Any, kafka_bootstrap: str, make_topic: Any, tmp_path: Path
) -> None:
    base = airflow_env.pipeline()
    dags: Path = airflow_env.dags
    (dags / "eo_demo_pipelines.py").rename(dags / "eo_demo_base.py")
    (dags / "eo_demo_pipelines.py").write_text(textwrap.dedent(_PIPELINES))
    (dags / "eo_test_transforms.py").write_text((ROOT / "tests" / "eo_test_transforms.py").read_text())
    notify_file = tmp_path / "notified.jsonl"
    source = base.source_topics[0]
    # Poison first: the first checkpoint (25 offsets from each partition's start) holds it.
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition in POISON_PARTITIONS:
        producer.produce(source, value=b"POISON", partition=partition)
    assert producer.flush(30) == 0
    produce_sample(kafka_bootstrap, source)

    with statsd_listener() as statsd:
        airflow_env.env.update(
            {
                "EO_TEST_DLQ": make_topic("af-dlq", 1),
                "EO_TEST_NOTIFY_FILE": str(notify_file),
                "EO_DEMO_TRANSFORM": "eo_test_transforms:poison",
                **statsd_env(statsd.port, tags="influxdb"),
            }
        )
        (run,) = airflow_env.run_dag_test("eo_pipeline", runs=1)
        assert run["state"] == "success", run
        # UDP: what the tasks sent is there once they have ended, or very soon after.
        poll_until(lambda: len(statsd.metrics("airflow.eo.")) >= 5, timeout=10)
        sent = statsd.metrics("airflow.eo.")
        airflow_own = statsd.metrics("airflow.ti.")

    with Ledger(base.ledger_url) as ledger:
        (cp,) = ledger.list_checkpoints(base.name)
    assert cp.state is CheckpointState.COMMITTED
    assert cp.dead_letters == len(POISON_PARTITIONS), cp

    by_name: dict[str, list[Any]] = {}
    for metric in sent:
        by_name.setdefault(metric.name, []).append(metric)
    assert all(m.tags == {"pipeline": base.name} for m in sent), sent
    (records,) = by_name["airflow.eo.checkpoint.records"]
    assert (records.kind, records.value) == ("c", cp.records)
    (dead,) = by_name["airflow.eo.dead_letters"]
    assert (dead.kind, dead.value) == ("c", cp.dead_letters)
    (commit_s,) = by_name["airflow.eo.commit.seconds"]
    assert commit_s.kind == "ms" and commit_s.value > 0
    # The prepare's own measurement, sent by the Spark driver spark-submit ran for the task.
    (prepare_s,) = by_name["airflow.eo.prepare.seconds"]
    assert prepare_s.kind == "ms" and prepare_s.value > 0
    # Lag: what the source holds beyond the committed checkpoint's ranges, read from Kafka now.
    ends = {(r.topic, r.partition): r.end for r in cp.ranges}
    log_ends = admin.list_offsets(base.kafka, list(ends), spec="latest")
    (lag,) = by_name["airflow.eo.lag.records"]
    assert (lag.kind, lag.value) == ("g", sum(log_ends[tp] - end for tp, end in ends.items()))
    assert lag.value > 0
    assert "airflow.eo.checkpoint.aborted" not in by_name
    # Airflow's own task metrics went the same way (the Task SDK under dag.test() sends Stats).
    assert airflow_own, "no ti.* metric from Airflow itself"

    (note,) = [json.loads(line) for line in notify_file.read_text().splitlines()]
    assert note["event"] == "dead_letters" and note["pipeline"] == base.name
    assert note["checkpoint_id"] == cp.checkpoint_id == 1
    assert note["dead_letters"] == cp.dead_letters and note["records"] == cp.records
    assert note["dead_letter_topic"] == airflow_env.env["EO_TEST_DLQ"]
    assert note["task_id"] == note["ti_task_id"] == "eo.commit"
    assert note["message"] == f"{base.name}: {cp.dead_letters} dead"
