"""``eo doctor`` against the real broker: a fresh pipeline is all ok; a missing sink topic,
a transaction timeout above the broker's maximum, a foreign commit marker and a member in
the marker group each fail, naming what to change."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from eo_harness import EO

from airflow_provider_eo import names
from airflow_provider_eo.core.doctor import DoctorReport, Finding, run_doctor
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka]


def _pipeline(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], **kw: Any
) -> Pipeline:
    source = make_topic("src", partitions=2)
    sink = kw.pop("sink_topic", None) or make_topic("sink", partitions=2)
    pipeline = Pipeline(
        name=f"doc-{uuid.uuid4().hex[:8]}",
        kafka=dict(kafka_config),
        source_topics=[source],
        sink_topic=sink,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        **kw,
    )
    Ledger(pipeline.ledger_url).close()  # an empty ledger at head (what `eo ledger upgrade` leaves)
    return pipeline


def _by_check(report: DoctorReport) -> dict[str, Finding]:
    return {f.check: f for f in report.findings}


def _cli(pipeline: Pipeline, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": pipeline.to_json()}
    return subprocess.run(
        [EO, "doctor", "eo_test_pipelines:from_env", "--json", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_fresh_pipeline_is_all_ok_and_exits_0(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    pipeline = _pipeline(tmp_path, kafka_config, make_topic)
    proc = _cli(pipeline)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["safe"] is True
    assert {f["severity"] for f in report["findings"]} == {"ok"}, report
    checks = {f["check"] for f in report["findings"]}
    assert {
        "ledger",
        "transactional-id-prefix",
        "transaction-timeout",
        f"source-topic {pipeline.source_topics[0]}",
        f"sink-topic {pipeline.sink_topic}",
        "marker-group members",
        "marker-group identity",
        "open-transactions",
        "staging",
        "staging shared",  # a local master: the executors write where this process looks
        "spark-connector",
    } <= checks


def test_missing_sink_topic_fails_naming_it(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    missing = f"no-such-sink-{uuid.uuid4().hex[:6]}"
    pipeline = _pipeline(tmp_path, kafka_config, make_topic, sink_topic=missing)
    proc = _cli(pipeline, "--no-spark-probe")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "fail"]
    assert [f["check"] for f in failed] == [f"sink-topic {missing}"], failed
    assert f"sink topic {missing!r} does not exist" in failed[0]["found"]
    assert f"--topic {missing}" in failed[0]["change"]


def test_transaction_timeout_above_the_brokers_max_fails(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    """A second broker with transaction.max.timeout.ms=30000 (the session broker has
    Kafka's default, 15 min, which Pipeline itself already enforces)."""
    from airflow_provider_eo.stack.kafka import LocalKafka

    kafka = LocalKafka(home=tmp_path / "kafka", extra_config={"transaction.max.timeout.ms": "30000"})
    info = kafka.up(timeout_s=120)
    try:
        config = {"bootstrap.servers": info.bootstrap}
        too_long = _pipeline(tmp_path, config, _maker(config), transaction_timeout_ms=60_000)
        report = run_doctor(too_long)
        finding = _by_check(report)["transaction-timeout"]
        assert report.exit_code == 1 and finding.severity == "fail", report.as_dict()
        assert "transaction_timeout_ms=60000" in finding.found and "30000" in finding.found
        assert "at most 30000" in finding.change
        within = _pipeline(tmp_path, config, _maker(config), transaction_timeout_ms=30_000)
        assert _by_check(run_doctor(within))["transaction-timeout"].severity == "ok"
    finally:
        kafka.wipe()


def _maker(config: dict[str, Any]) -> Callable[..., str]:
    def _make(prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.ensure_topic(config, name, partitions=partitions)
        return name

    return _make


def test_foreign_marker_fails(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    """A commit marker written by another ledger's identity (a second deployment with the
    same pipeline name): the doctor fails with check_marker_identity's refusal."""
    pipeline = _pipeline(tmp_path, kafka_config, make_topic)
    with Ledger(pipeline.ledger_url) as ledger:
        ours = ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint()).identity
    assert _by_check(run_doctor(pipeline))["marker-group identity"].severity == "ok"

    foreign = uuid.uuid4().hex
    producer = Producer({**kafka_config, "transactional.id": f"foreign-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    group = names.marker_group(pipeline)
    metadata = admin.group_consumer(kafka_config, group).consumer_group_metadata()
    producer.send_offsets_to_transaction(
        [TopicPartition(pipeline.sink_topic, 0, 3, metadata=names.marker_metadata(foreign))], metadata, 30
    )
    producer.commit_transaction(30)

    report = run_doctor(pipeline)
    finding = _by_check(report)["marker-group identity"]
    assert report.exit_code == 1 and finding.severity == "fail", report.as_dict()
    assert foreign in finding.found and ours in finding.found and group in finding.found


def test_member_in_the_marker_group_fails(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    pipeline = _pipeline(tmp_path, kafka_config, make_topic)
    group = names.marker_group(pipeline)
    intruder = Consumer({**kafka_config, "group.id": group, "client.id": "intruder"})
    intruder.subscribe([pipeline.source_topics[0]])
    try:
        deadline = time.monotonic() + 60
        while True:  # until the broker has it as a member (the join completes in a poll)
            intruder.poll(0.5)
            finding = _by_check(run_doctor(pipeline))["marker-group members"]
            if finding.severity == "fail" or time.monotonic() > deadline:
                break
        assert finding.severity == "fail", finding
        assert "intruder@" in finding.found and group in finding.change
    finally:
        intruder.close()
