"""The operations side of a Structured Streaming query writing through
``KafkaExactlyOnceSink`` (one running count, run as its own process twice): its savepoint
(position and a copy of its checkpoint location) restores the query exactly; ``eo doctor``,
the UI's API and the checkpoint sensor/trigger see its batches. Output is checked against a
recount of the source, never against the ledger's own numbers."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import wait_for
from fastapi.testclient import TestClient

from airflow_provider_eo.core.doctor import run_doctor
from airflow_provider_eo.core.restore import restore_from_savepoint
from airflow_provider_eo.errors import RestoreRefused
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink, read_topic, settled_ends
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.sensors.checkpoint import EoCheckpointSensor
from airflow_provider_eo.streaming.checkpoint_location import read_location
from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger
from airflow_provider_eo.ui import app as ui_app
from airflow_provider_eo.ui.lag import LagCache

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

QUERY = Path(__file__).resolve().parents[2] / "eo_ss_query.py"

SINK_MODULE = """
from airflow_provider_eo.streaming import KafkaExactlyOnceSink

SINK = KafkaExactlyOnceSink(
    name={name!r},
    kafka={{"bootstrap.servers": {bootstrap!r}}},
    sink_topic={sink!r},
    ledger_url={ledger_url!r},
    staging_dir={staging_dir!r},
    checkpoint_location={checkpoint!r},
    commit_shards=2,
    commit_mode="local",
    heartbeat_s=1.0,
)
"""


def run_query(spec: dict[str, Any], env: dict[str, str], log: Path) -> None:
    """The query (tests/eo_ss_query.py, availableNow) until it exits 0."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(QUERY), json.dumps(spec)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its Spark JVM, if left
        except ProcessLookupError:
            pass
        proc.wait()
    assert code == 0, log.read_text()[-4000:]


def eo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_eo.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ui_client() -> TestClient:
    app = ui_app.create_app()
    app.dependency_overrides[ui_app._access] = lambda: ui_app.Access("someone", lambda **_: True)
    app.state.eo.lag = LagCache(ui_app.read_log_ends, ttl_s=0.0)  # read Kafka at every request
    return TestClient(app)


def test_savepoint_copy_restores_the_query_and_doctor_ui_sensor_see_its_batches(
    tmp_path: Path,
    kafka_config: dict[str, Any],
    make_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, sink = make_topic("ss-ops-src", partitions=2), make_topic("ss-ops-out", partitions=2)
    tps = [(source, 0), (source, 1)]
    name = f"ss-ops-{uuid.uuid4().hex[:6]}"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    checkpoint, copy = tmp_path / "checkpoint", tmp_path / "copy"
    spec: dict[str, Any] = {
        "bootstrap": kafka_config["bootstrap.servers"],
        "source": source,
        "sink": sink,
        "name": name,
        "ledger_url": ledger_url,
        "staging_dir": str(tmp_path / "staging"),
        "checkpoint": str(checkpoint),
        "kind": "count",
        "commit_shards": 2,
        "max_offsets": 40,
    }
    module = f"eo_ops_sink_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(SINK_MODULE.format(**spec))
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = f"{module}:SINK"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    env.pop("EO_FAULT", None)

    def produce(numbers: range) -> None:
        producer = Producer(kafka_config)
        for i in numbers:
            producer.produce(source, key=f"k{i % 7}", value=str(i), partition=i % 2)
        assert producer.flush(30) == 0

    def committed() -> list[CheckpointRecord]:
        with Ledger(ledger_url) as ledger:
            cps = [c for c in ledger.list_checkpoints(name) if c.state is CheckpointState.COMMITTED]
        return sorted(cps, key=lambda c: c.checkpoint_id)

    produce(range(100))
    started = dt.datetime.now(dt.UTC)
    run_query(spec, env, tmp_path / "run-1.log")
    batches = committed()
    assert [c.batch_id for c in batches] == [0, 1, 2]  # 40 + 40 + 20 records
    last = batches[-1]
    query = last.query_id
    ends = {str(r.partition): r.end for r in last.ranges}

    # -- savepoints: the position, then the position with a copy of the checkpoint location
    position = eo(env, "savepoint", "create", ref, "at-end", "--json")
    assert position.returncode == 0, position.stderr
    sp = last_json(position)
    assert (sp["query_id"], sp["batch_id"], sp["checkpoint_id"]) == (query, 2, last.checkpoint_id)
    assert sp["offsets"] == {source: ends} and sp["checkpoint_copy"] is None
    with_copy = eo(env, "savepoint", "create", ref, "with-copy", "--copy-checkpoint-to", str(copy), "--json")
    assert with_copy.returncode == 0, with_copy.stderr
    sp = last_json(with_copy)
    assert (sp["batch_id"], sp["checkpoint_copy"]) == (2, str(copy))
    copied = read_location(str(copy))
    assert (copied.query_id, copied.latest_offsets, copied.latest_commit) == (query, 2, 2)
    pipeline = load_pipeline(ref)
    with Ledger(ledger_url) as ledger, pytest.raises(RestoreRefused, match="Structured Streaming query"):
        restore_from_savepoint(pipeline, ledger, "at-end")

    # -- doctor: the CLI on the sink; another query's location fails the identity check
    doctor = eo(env, "doctor", ref, "--no-spark-probe", "--json")
    report = last_json(doctor)
    assert doctor.returncode == 0 and report["safe"], report  # nothing else fails for a sink
    checks = {f["check"]: f for f in report["findings"]}
    for check in ("query-run", "query-batch", "query-identity", "query-position"):
        assert checks[check]["severity"] == "ok", checks
    assert f"batch 2 (checkpoint {last.checkpoint_id}) is COMMITTED" in checks["query-batch"]["found"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "metadata").write_text('{"id":"another-query"}\n')
    found = run_doctor(pipeline, spark=False, query_location=partial(read_location, str(other)))
    identity = next(f for f in found.findings if f.check == "query-identity")
    assert identity.severity == "fail" and "another-query" in identity.found

    # -- UI: each checkpoint's batch, lag from the committed batches
    monkeypatch.setenv("EO_LEDGER_URL", ledger_url)
    monkeypatch.delenv("EO_LEDGER_CONN_ID", raising=False)
    monkeypatch.delenv("EO_KAFKA_CONN_ID", raising=False)
    monkeypatch.setenv("EO_KAFKA_BOOTSTRAP", kafka_config["bootstrap.servers"])
    client = ui_client()
    page = client.get(f"/api/pipelines/{name}/checkpoints").json()
    assert [(c["batch_id"], c["query_id"]) for c in page["checkpoints"]] == [
        (2, query),
        (1, query),
        (0, query),
    ]
    assert client.get(f"/api/pipelines/{name}").json()["last_committed"]["batch_id"] == 2

    def lag_is(total: int) -> bool:
        lag = client.get(f"/api/pipelines/{name}/lag").json()
        return lag["state"] == "ok" and lag["total"] == total

    wait_for(lambda: lag_is(0), "no lag after the first run", timeout=60)

    # -- sensor: a fresh commit after a time (its poke), and a batch's checkpoint (the trigger)
    fresh = EoCheckpointSensor(
        task_id="fresh", pipeline=ref, committed_after=started.isoformat(), deferrable=False
    )
    done = fresh.poke({})  # type: ignore[arg-type]
    assert done and done.xcom_value["checkpoint_id"] == last.checkpoint_id  # type: ignore[union-attr]
    later = EoCheckpointSensor(
        task_id="later", pipeline=ref, committed_after=dt.datetime.now(dt.UTC).isoformat(), deferrable=False
    )
    assert later.poke({}) is False  # type: ignore[arg-type]

    # -- restore: the query started from the copy continues after batch 2, state and all
    produce(range(100, 130))
    wait_for(lambda: lag_is(30), "the new records seen as lag", timeout=60)
    run_query({**spec, "checkpoint": str(copy)}, env, tmp_path / "run-2.log")
    batches = committed()
    assert [c.batch_id for c in batches] == [0, 1, 2, 3]
    assert {r.key: r.start for r in batches[3].ranges} == {r.key: r.end for r in last.ranges}
    records = {
        (int(m.partition()), int(m.offset())): m.key().decode()
        for m in read_topic(kafka_config, source, settled_ends(kafka_config, tps), isolation="read_committed")
    }
    running: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    for cp in batches:  # each batch emits the running count of every key it touched
        touched = set()
        for r in cp.ranges:
            for offset in range(r.start, r.end):
                running[records[(r.partition, offset)]] += 1
                touched.add(records[(r.partition, offset)])
        expected.update(f"{key}={running[key]}" for key in touched)
    values = [m.value().decode() for m in read_sink(kafka_config, sink)]
    assert Counter(values) == expected  # the counts continue from the copy's state, each once
    assert dict(running) == dict(Counter(records.values()))
    newest = {r.key: r.end for r in batches[3].ranges}
    assert (
        admin.committed_group_offsets(kafka_config, f"eo.{name}", tps)
        == newest
        == settled_ends(kafka_config, tps)
    )
    wait_for(lambda: lag_is(0), "no lag after the restored run", timeout=60)
    done = later.poke({})  # type: ignore[arg-type]
    assert done and done.xcom_value["checkpoint_id"] == batches[3].checkpoint_id  # type: ignore[union-attr]
    trigger = EoCheckpointTrigger(
        pipeline=name, checkpoint_id=batches[3].checkpoint_id, ledger_url=ledger_url, wait_for="committed"
    )
    event = asyncio.run(anext(aiter(trigger.run())))
    assert event.payload["status"] == "success" and event.payload["state"] == "COMMITTED"
    # the original location is now a batch behind the ledger: its restart would re-run batch 3 unpublished
    behind = run_doctor(pipeline, spark=False, query_location=partial(read_location, str(checkpoint)))
    position_finding = next(f for f in behind.findings if f.check == "query-position")
    assert (
        position_finding.severity == "ok" and "re-runs batch 3 without publishing" in position_finding.found
    )
