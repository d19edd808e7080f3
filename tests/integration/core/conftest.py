"""Helpers for the exactly-once protocol tests: pipelines on fresh topics, CLI subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.kafka.audit import audit_pipeline, read_sink
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline

EO = str(Path(sys.executable).with_name("eo"))


class Harness:
    """One pipeline on its own source/sink topics, ledger file and staging folder."""

    def __init__(self, pipeline: Pipeline, config: dict[str, Any], spark: Any) -> None:
        self.pipeline = pipeline
        self.config = config
        self.spark = spark
        self.ledger = Ledger(pipeline.ledger_url)

    def with_(self, **changes: Any) -> Harness:
        return Harness(replace(self.pipeline, **changes), self.config, self.spark)

    def produce(self, n: int, *, keys: int = 7, start: int = 0, txn: str | None = None) -> None:
        """Keyed JSON-ish records ``k<i%keys>:<i>``; in a committed/aborted txn if asked."""
        conf: dict[str, Any] = {**self.config, "linger.ms": 5}
        if txn:
            conf["transactional.id"] = f"feed-{uuid.uuid4().hex[:8]}"
        producer = Producer(conf)
        if txn:
            producer.init_transactions(30)
            producer.begin_transaction()
        for i in range(start, start + n):
            key = f"k{i % keys}"
            producer.produce(self.pipeline.source_topics[0], key=key, value=f"{key}:{i}".encode())
        if txn == "commit":
            producer.commit_transaction(30)
        elif txn == "abort":
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.flush(30)

    def run_once(self) -> Any:
        from airflow_provider_eo.core.runner import run_once

        return run_once(self.pipeline, ledger=self.ledger, spark=self.spark)

    def drain(self, max_cycles: int = 20) -> list[Any]:
        results = []
        for _ in range(max_cycles):
            r = self.run_once()
            if r.checkpoint is None:
                return results
            results.append(r)
        raise AssertionError("pipeline did not drain")

    def prepare(self, checkpoint_id: int) -> Any:
        from airflow_provider_eo.spark.prepare import prepare_checkpoint

        return prepare_checkpoint(self.spark, self.pipeline, self.ledger, checkpoint_id)

    def plan(self) -> Any:
        from airflow_provider_eo.core.plan import plan_checkpoint

        return plan_checkpoint(self.pipeline, self.ledger)

    def commit(self, checkpoint_id: int) -> Any:
        from airflow_provider_eo.core.commit import commit_checkpoint

        return commit_checkpoint(self.pipeline, self.ledger, checkpoint_id)

    def cli(
        self,
        *args: str,
        fault: str | None = None,
        action: str = "kill",
        timeout: float = 300,
        wait: bool = True,
    ) -> Any:
        """Run ``eo <args> eo_test_pipelines:from_env`` in a child process."""
        env = {**os.environ, "EO_TEST_PIPELINE_JSON": self.pipeline.to_json()}
        env.pop("EO_FAULT", None)
        if fault:
            env["EO_FAULT"] = fault
            env["EO_FAULT_ACTION"] = action
        cmd = [EO, *args, "eo_test_pipelines:from_env", "--json"]
        if not wait:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def audit(self) -> Any:
        return audit_pipeline(self.pipeline, self.ledger)

    def sink_records(self) -> list[Any]:
        return read_sink(self.config, self.pipeline.sink_topic)

    def assert_exactly_once(self, expected_records: int | None = None) -> Any:
        report = self.audit()
        assert report.duplicates == 0, report.as_dict()
        assert report.missing == 0, report.as_dict()
        assert report.unexpected == 0, report.as_dict()
        if expected_records is not None:
            assert sum(c.observed for c in report.checkpoints) == expected_records, report.as_dict()
        return report


@pytest.fixture()
def harness(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str], spark: Any
) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def _make(
        *,
        source_partitions: int = 3,
        sink_partitions: int = 3,
        transform: str = "eo_test_transforms:identity",
        sink_config: dict[str, str] | None = None,
        **kw: Any,
    ) -> Harness:
        source = make_topic("src", partitions=source_partitions)
        sink = make_topic("sink", partitions=sink_partitions, **(sink_config or {}))
        pipeline = Pipeline(
            name=f"p-{uuid.uuid4().hex[:8]}",
            kafka=dict(kafka_config),
            source_topics=[source],
            sink_topic=sink,
            transform=transform,
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=str(tmp_path / "staging"),
            **kw,
        )
        h = Harness(pipeline, dict(kafka_config), spark)
        made.append(h)
        return h

    yield _make
    for h in made:
        h.ledger.close()


def parse_json_line(stdout: str) -> dict[str, Any]:
    """The last JSON line a `eo ... --json` command printed."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"no JSON in output: {stdout!r}")
