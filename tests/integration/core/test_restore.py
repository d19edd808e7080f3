"""Restore from a savepoint and reset on a real broker and Spark: a recorded
lineage break after which exactly the records past the new start are processed again."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from eo_harness import EO
from sqlalchemy import select

from airflow_provider_eo.core.restore import restore_from_savepoint
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.ledger.models import Base

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
REF = "eo_test_pipelines:from_env"


def snapshot(ledger: Ledger) -> dict[str, list[Any]]:
    """Every row of every ledger table, in a stable order."""
    with ledger.engine.connect() as conn:
        return {
            t.name: sorted((tuple(map(repr, row)) for row in conn.execute(select(t))), key=repr)
            for t in Base.metadata.sorted_tables
        }


def eo(h: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``eo <args>`` in a child process; ``REF`` in ``args`` is the harness's pipeline."""
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    env.pop("EO_FAULT", None)
    return subprocess.run([EO, *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def _values(h: Any) -> Counter[str]:
    return Counter(m.value().decode() for m in read_sink(h.config, h.pipeline.sink_topic))


def _json(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def test_restore_reprocesses_exactly_the_records_after_the_savepoint(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=3, sink_partitions=2)
    h.produce(90)
    h.drain()
    sp = _json(eo(h, "savepoint", "create", REF, "sp1", "--json"))
    h.produce(60, start=90)
    h.drain()
    restored = _json(eo(h, "restore", REF, "--savepoint", "sp1", "--json"))
    assert restored["lineage"] == 2 and restored["offsets"] == sp["offsets"] and not restored["repeated"]
    h.drain()
    seen = _values(h)
    before = {f"k{i % 7}:{i}" for i in range(90)}
    after = {f"k{i % 7}:{i}" for i in range(90, 150)}
    assert set(seen) == before | after
    assert all(seen[v] == 1 for v in before), "records before the savepoint were processed again"
    assert all(seen[v] == 2 for v in after), (
        "records after the savepoint were not processed exactly once more"
    )
    event = next(e for e in h.ledger.events(h.pipeline.name) if e.kind == "restore")
    assert event.details["savepoint"] == "sp1" and "@" in event.details["requested_by"]
    assert event.details["from_lineage"] == 1 and event.details["to_lineage"] == 2
    assert h.ledger.list_checkpoints(h.pipeline.name)[-1].lineage == 2


def test_restore_request_key_restores_once_even_after_progress(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(20)
    h.drain()
    assert eo(h, "savepoint", "create", REF, "sp").returncode == 0
    h.produce(20, start=20)
    h.drain()
    first = restore_from_savepoint(h.pipeline, h.ledger, "sp", request_key="eo_restore/run1")
    cp = h.plan()  # the restored pipeline already moved on: a retry must still be a no-op
    again = restore_from_savepoint(h.pipeline, h.ledger, "sp", request_key="eo_restore/run1")
    assert again.repeated and again.lineage == first.lineage and again.offsets == first.offsets
    assert [e.kind for e in h.ledger.events(h.pipeline.name)].count("restore") == 1
    assert h.ledger.unfinished(h.pipeline.name) == h.ledger.get(h.pipeline.name, cp.checkpoint_id)


def test_restore_partition_differences_are_refused_unless_allowed(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=1)
    topic = h.pipeline.source_topics[0]
    h.produce(40)
    h.drain()
    assert eo(h, "savepoint", "create", REF, "sp").returncode == 0
    client = AdminClient(h.config)
    client.create_partitions([NewPartitions(topic, 3)], request_timeout=30)[topic].result(timeout=30)
    before = snapshot(h.ledger)
    proc = eo(h, "restore", REF, "--savepoint", "sp")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and h.pipeline.name in message
    assert f"{topic}[2] is in the source topics but not in the savepoint" in message
    assert "--allow-non-restored" in message
    assert snapshot(h.ledger) == before
    restored = _json(eo(h, "restore", REF, "--savepoint", "sp", "--allow-non-restored", "--json"))
    assert restored["non_restored"] == {"vanished": [], "lacking": {f"{topic}[2]": 0}}
    assert restored["offsets"][topic]["2"] == 0
    event = next(e for e in h.ledger.events(h.pipeline.name) if e.kind == "restore")
    assert event.details["non_restored"]["lacking"] == {f"{topic}[2]": 0}


def test_restore_below_the_log_start_is_refused_naming_the_partition(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    topic = h.pipeline.source_topics[0]
    h.produce(20)
    h.drain()
    assert eo(h, "savepoint", "create", REF, "sp").returncode == 0
    h.produce(20, start=20)
    h.drain()
    client = AdminClient(h.config)
    for fut in client.delete_records([TopicPartition(topic, 0, 30)], request_timeout=30).values():
        fut.result(timeout=60)
    before = snapshot(h.ledger)
    proc = eo(h, "restore", REF, "--savepoint", "sp")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and h.pipeline.name in message
    assert f"{topic}[0]: offset 20 is below the log start 30" in message
    assert snapshot(h.ledger) == before


def test_reset_to_latest_then_earliest(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=1)
    topic = h.pipeline.source_topics[0]
    h.produce(30)
    h.drain()
    h.produce(30, start=30)  # not processed yet: skipped by the reset to latest
    latest = _json(eo(h, "reset", REF, "--to", "latest", "--json"))
    assert latest["reason"] == "reset to latest" and latest["lineage"] == 2
    h.produce(10, start=60)
    h.drain()
    seen = _values(h)
    assert set(seen) == {f"k{i % 7}:{i}" for i in (*range(30), *range(60, 70))}
    offsets = {topic: {"0": 0}}
    reset = _json(eo(h, "reset", REF, "--to", "offsets=" + json.dumps(offsets), "--json"))
    assert reset["offsets"][topic]["0"] == 0  # partition 1 keeps its position
    event = [e for e in h.ledger.events(h.pipeline.name) if e.kind == "restore"][-1]
    assert event.details["target"].startswith("offsets=") and event.details["to_lineage"] == 3
