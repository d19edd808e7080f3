"""The operations side of a Structured Streaming query writing through
``KafkaExactlyOnceSink`` (one running count, run as its own process twice): its savepoint
(position and a copy of its checkpoint location) restores the query exactly; ``eo doctor``,
the UI's API and the checkpoint sensor/trigger see its batches. Output is checked against a
recount of the source, never against the ledger's own numbers."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import os
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
from eo_harness import wait_for, with_group_gone
from fastapi.testclient import TestClient

from airflow_provider_eo.core.doctor import run_doctor
from airflow_provider_eo.core.restore import restore_from_savepoint
from airflow_provider_eo.errors import RestoreRefused
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink, read_topic, settled_ends
from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.sensors.checkpoint import EoCheckpointSensor
from airflow_provider_eo.streaming.checkpoint_location import read_location
from airflow_provider_eo.streaming.savepoint import take_query_savepoint
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


def start_query(spec: dict[str, Any], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The query (tests/eo_ss_query.py) as its own process (session)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(QUERY), json.dumps(spec)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for the query's process to exit 0; stop what it left (its Spark JVM)."""
    try:
        code = proc.wait(timeout=300)
    finally:
        with_group_gone(proc)
    assert code == 0, log.read_text()[-4000:]


def run_query(spec: dict[str, Any], env: dict[str, str], log: Path) -> None:
    """The query with ``availableNow``, until it exits 0."""
    finish(start_query(spec, env, log), log)


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


class Ops:
    """One running-count query's topics, ledger, checkpoint location and sink module."""

    def __init__(
        self,
        tmp_path: Path,
        kafka_config: dict[str, Any],
        make_topic: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.config = kafka_config
        self.source = make_topic("ss-ops-src", partitions=2)
        self.sink = make_topic("ss-ops-out", partitions=2)
        self.tps = [(self.source, 0), (self.source, 1)]
        self.name = f"ss-ops-{uuid.uuid4().hex[:6]}"
        self.ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        self.checkpoint, self.copy = tmp_path / "checkpoint", tmp_path / "copy"
        self.logs = tmp_path
        self.spec: dict[str, Any] = {
            "bootstrap": kafka_config["bootstrap.servers"],
            "source": self.source,
            "sink": self.sink,
            "name": self.name,
            "ledger_url": self.ledger_url,
            "staging_dir": str(tmp_path / "staging"),
            "checkpoint": str(self.checkpoint),
            "kind": "count",
            "commit_shards": 2,
            "max_offsets": 40,
        }
        module = f"eo_ops_sink_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(SINK_MODULE.format(**self.spec))
        monkeypatch.syspath_prepend(str(tmp_path))
        self.ref = f"{module}:SINK"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        }
        self.env.pop("EO_FAULT", None)

    def produce(self, numbers: range) -> None:
        producer = Producer(self.config)
        for i in numbers:
            producer.produce(self.source, key=f"k{i % 7}", value=str(i), partition=i % 2)
        assert producer.flush(30) == 0

    def committed(self) -> list[CheckpointRecord]:
        with Ledger(self.ledger_url) as ledger:
            try:
                cps = [c for c in ledger.list_checkpoints(self.name) if c.state is CheckpointState.COMMITTED]
            except CheckpointNotFound:  # the query has not registered the pipeline yet
                return []
        return sorted(cps, key=lambda c: c.checkpoint_id)

    def consumed(self) -> int:
        """Source records in the committed batches' ranges."""
        return sum(r.end - r.start for c in self.committed() for r in c.ranges)

    def check_output(self) -> None:
        """Each committed batch's running counts (recounted from the source records of its
        ranges) in the sink exactly once; the last counts are the source's; the group at the
        source's ends; the batches contiguous."""
        batches = self.committed()
        assert [c.batch_id for c in batches] == list(range(len(batches)))
        for before, after in itertools.pairwise(batches):
            assert {r.key: r.start for r in after.ranges} == {r.key: r.end for r in before.ranges}
        ends = settled_ends(self.config, self.tps)
        records = {
            (int(m.partition()), int(m.offset())): m.key().decode()
            for m in read_topic(self.config, self.source, ends, isolation="read_committed")
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
        values = [m.value().decode() for m in read_sink(self.config, self.sink)]
        assert Counter(values) == expected
        assert dict(running) == dict(Counter(records.values()))
        newest = {r.key: r.end for r in batches[-1].ranges}
        assert admin.committed_group_offsets(self.config, f"eo.{self.name}", self.tps) == newest == ends


@pytest.fixture()
def ops(
    tmp_path: Path,
    kafka_config: dict[str, Any],
    make_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> Ops:
    return Ops(tmp_path, kafka_config, make_topic, monkeypatch)


def test_savepoint_copy_restores_the_query_and_doctor_ui_sensor_see_its_batches(
    ops: Ops, tmp_path: Path, kafka_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, ledger_url = ops.name, ops.ledger_url
    checkpoint, copy, spec, ref, env = ops.checkpoint, ops.copy, ops.spec, ops.ref, ops.env
    produce, committed = ops.produce, ops.committed
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
    assert sp["offsets"] == {ops.source: ends} and sp["checkpoint_copy"] is None
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
    ops.check_output()  # the counts continue from the copy's state, each once
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


def test_a_copy_taken_while_the_query_runs_restores_it_without_publishing_twice(
    ops: Ops, tmp_path: Path
) -> None:
    """The copy is taken while the query plans its first batches (40 + 40 + 20 records, all
    in the topic before it starts, so the restarted query plans the same ones again): the
    restarted query re-runs the batches after the copy's without publishing them, then
    continues its counts with the records produced after."""
    ops.produce(range(100))
    live = start_query({**ops.spec, "trigger_s": 1}, ops.env, tmp_path / "live.log")
    try:
        # Committed in the ledger, then in Spark's commit log (written after the sink's
        # batch returns): a copy needs both.
        wait_for(
            lambda: bool(ops.committed()) and read_location(str(ops.checkpoint)).latest_commit is not None,
            "the query's first batch in the ledger and in its commit log",
            timeout=180,
        )
        with Ledger(ops.ledger_url) as ledger:
            taken = take_query_savepoint(
                load_pipeline(ops.ref),
                ledger,
                "while-running",
                checkpoint_location=str(ops.checkpoint),
                copy_to=str(ops.copy),
            )
        wait_for(lambda: ops.consumed() == 100, "the first 100 records", timeout=180)
        with Ledger(ops.ledger_url) as ledger:
            assert ledger.request_stream_stop(ops.name, requested_by="the test")
        finish(live, tmp_path / "live.log")
    finally:
        with_group_gone(live)
    assert [c.batch_id for c in ops.committed()] == [0, 1, 2]
    copied = read_location(str(ops.copy))
    assert copied.latest_offsets == copied.latest_commit == taken.batch_id
    # restarted from the copy: re-runs the batches after it (nothing published), then new records
    restored = start_query(
        {**ops.spec, "checkpoint": str(ops.copy), "trigger_s": 1}, ops.env, tmp_path / "restored.log"
    )
    try:
        wait_for(
            lambda: read_location(str(ops.copy)).latest_commit == 2,
            "the re-run of batches up to 2",
            timeout=180,
        )
        assert [c.batch_id for c in ops.committed()] == [0, 1, 2]
        ops.produce(range(100, 130))
        wait_for(lambda: ops.consumed() == 130, "the 30 new records", timeout=180)
        with Ledger(ops.ledger_url) as ledger:
            assert ledger.request_stream_stop(ops.name, requested_by="the test")
        finish(restored, tmp_path / "restored.log")
    finally:
        with_group_gone(restored)
    assert [c.batch_id for c in ops.committed()] == [0, 1, 2, 3]
    ops.check_output()
