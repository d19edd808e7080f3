"""Test harness for the exactly-once protocol: a pipeline on fresh topics, CLI subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from airflow_provider_eo.core.audit import audit_pipeline
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.pipeline import Pipeline

EO = str(Path(sys.executable).with_name("eo"))


class Child:
    """A running ``eo`` child process whose output goes to temporary files."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Any, err: Any) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.files = (out, err)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Wait for the child; return (stdout, stderr)."""
        self.proc.wait(timeout=timeout)
        out = []
        for f in self.files:
            f.seek(0)
            out.append(f.read())
        return out[0], out[1]


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
            value = f"{key}:{i}".encode()
            while True:
                try:
                    producer.produce(self.pipeline.source_topics[0], key=key, value=value)
                    break
                except BufferError:  # the local queue is full (a large batch): let it drain
                    producer.poll(0.2)
        if txn == "commit":
            producer.commit_transaction(30)
        elif txn == "abort":
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.flush(30)

    def run_once(self) -> Any:
        from airflow_provider_eo.core.runner import run_once
        from airflow_provider_eo.spark.stager import SparkStager

        return run_once(self.pipeline, ledger=self.ledger, stager=SparkStager(self.spark))

    def drain(self, max_cycles: int = 20) -> list[Any]:
        results = []
        for _ in range(max_cycles):
            r = self.run_once()
            if r.checkpoint is None:
                return results
            results.append(r)
        raise AssertionError("pipeline did not drain")

    def prepare(self, checkpoint_id: int) -> Any:
        from airflow_provider_eo.core.prepare import prepare_checkpoint
        from airflow_provider_eo.spark.stager import SparkStager

        return prepare_checkpoint(self.pipeline, self.ledger, checkpoint_id, stager=SparkStager(self.spark))

    def plan(self) -> Any:
        from airflow_provider_eo.core.plan import plan_checkpoint

        return plan_checkpoint(self.pipeline, self.ledger)

    def commit(self, checkpoint_id: int) -> Any:
        from airflow_provider_eo.core.commit import commit_checkpoint

        return commit_checkpoint(self.pipeline, self.ledger, checkpoint_id)

    def expire_lease(self, checkpoint_id: int) -> None:
        """Move the commit lease's end into the past: what the clock passing it does while its
        holder (a paused committer) cannot renew it."""
        import datetime as dt

        from sqlalchemy import select, update
        from sqlalchemy.orm import Session

        from airflow_provider_eo.ledger.models import Checkpoint
        from airflow_provider_eo.ledger.models import Pipeline as PipelineRow

        past = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
        with Session(self.ledger.engine) as s, s.begin():
            pid = s.execute(select(PipelineRow.id).where(PipelineRow.name == self.pipeline.name)).scalar_one()
            s.execute(
                update(Checkpoint)
                .where(Checkpoint.pipeline_id == pid, Checkpoint.checkpoint_id == checkpoint_id)
                .values(commit_lease_until=past)
            )

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
            # Files, not pipes: a chatty child (librdkafka retry logs) must never block on a
            # full pipe while the test waits for it to reach its fault point.
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed by the OS)
            return Child(subprocess.Popen(cmd, env=env, stdout=out, stderr=err), out, err)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def paused_commit(self) -> tuple[Any, Child]:
        """Plan and prepare a checkpoint, then start an ``eo commit`` child that stops itself
        (SIGSTOP) with its transaction open and every record sent. Returns (checkpoint, child)."""
        planned = self.plan()
        self.prepare(planned.checkpoint_id)
        child = self.cli("commit", fault="commit.before_commit_txn", action="pause", wait=False)
        wait_for(lambda: process_state(child.pid) == "T", "the committer to pause", child=child)
        return planned, child

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
        # After any fault, the pipeline's group offsets agree with the ledger.
        if self.ledger.last_committed(self.pipeline.name) is not None:
            from eo_faultlib import assert_group_offsets_match_ledger

            assert_group_offsets_match_ledger(self.pipeline, self.ledger)
        return report


def process_state(pid: int) -> str:
    """The one-letter state of a process (R, S, T = stopped, Z, ...); ``""`` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return ""


def poll_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Call ``predicate`` until it is true (True) or ``timeout`` seconds passed (False)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def with_group_gone(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group ``proc`` leads (started with ``start_new_session=True``: a
    Spark driver and its JVM) if anything of it is still there, and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(
    predicate: Callable[[], bool], what: str, timeout: float = 120.0, child: Child | None = None
) -> None:
    """Poll ``predicate`` until true or fail after ``timeout`` seconds (or when ``child``
    exits first, showing its output)."""

    def ready() -> bool:
        if predicate():
            return True
        if child is not None and child.poll() is not None:
            out, err = child.communicate()
            raise AssertionError(
                f"child exited ({child.returncode}) before {what}:\n"
                f"{out.decode()[-2000:]}\n{err.decode()[-4000:]}"
            )
        return False

    if not poll_until(ready, timeout):
        raise AssertionError(f"timed out waiting for {what}")


def parse_json_line(stdout: str) -> dict[str, Any]:
    """The last JSON line a `eo ... --json` command printed."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"no JSON in output: {stdout!r}")
