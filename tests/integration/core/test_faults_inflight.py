"""Broker faults while a running committer has a request in flight (docs/design.md §3: broker
restarts mid-transaction; ``commit_transaction`` times out).

Unlike a fault that stops the committer, here the committer keeps running: it is paused
at a step only to line the fault up, then resumed *while the broker is stopped*, and the
test waits until the committer's request has reached the broker's socket unread (seen in
``/proc/net/tcp``). Then the broker is either crashed and restarted (the request is lost
unanswered) or kept stopped past the client's timeout and resumed (the request is
processed late, after the client gave up). Every test ends with the audit and the group
offsets. The module runs its own broker: the session's broker is never stopped.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import (
    any_process_state,
    assert_group_offsets_match_ledger,
    broker_pid,
    bytes_in_flight_to,
    crash_restart,
    finish,
    kill_child,
    paused_commit,
    rdkafka_threads,
    sigcont,
)
from eo_harness import Child, Harness, wait_for

from airflow_provider_eo.kafka.admin import ensure_topic
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import LocalKafka, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 300
# Short client timeouts for the tests that keep the broker stopped: the committer gives up
# on a request within seconds. message.timeout.ms stays below the transaction timeout.
SHORT = {"request.timeout.ms": 2000, "socket.timeout.ms": 3000, "message.timeout.ms": 3000}
SHORT_TXN_MS = 5000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    # A fixed client port: a crash-restart must come back where the clients look for it.
    kafka = LocalKafka(home=tmp_path_factory.mktemp("inflight") / "kafka", port=free_port())
    kafka.up(timeout_s=120)
    try:
        yield kafka
    finally:
        pid = kafka.info()
        if pid is not None:
            sigcont(pid.pid)  # a failed test may leave it stopped
        kafka.wipe()


def _harness(broker: LocalKafka, tmp_path: Path, spark: Any, *, short: bool) -> Harness:
    info = broker.up(timeout_s=120)  # running, or restarted after an earlier test's failure
    assert info is not None
    config: dict[str, Any] = {"bootstrap.servers": info.bootstrap}
    source, sink = f"src-{uuid.uuid4().hex[:8]}", f"sink-{uuid.uuid4().hex[:8]}"
    ensure_topic(config, source, partitions=2)
    ensure_topic(config, sink, partitions=3)
    pipeline = Pipeline(
        name=f"inflight-{uuid.uuid4().hex[:8]}",
        kafka={**config, **(SHORT if short else {})},
        source_topics=[source],
        sink_topic=sink,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        transaction_timeout_ms=SHORT_TXN_MS if short else 60_000,
    )
    h = Harness(pipeline, config, spark)
    h.produce(RECORDS, keys=13)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    return h


def _resume_into_stopped_broker(broker: LocalKafka, committer: Child) -> tuple[int, set[int]]:
    """SIGSTOP the broker, resume the committer, and wait until one of its requests sits
    unread in the broker's socket. Returns (broker pid, the committer's librdkafka threads
    at that moment)."""
    pid = broker_pid(broker)
    port = broker.info().port  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: any_process_state(pid) == "T", "the broker to stop", timeout=30)
    threads = rdkafka_threads(committer.pid)
    sigcont(committer.pid)
    wait_for(
        lambda: bytes_in_flight_to(port, committer.pid) > 0,
        "a request of the committer in flight to the stopped broker",
        timeout=60,
        child=committer,
    )
    assert any_process_state(committer.pid) != "T"  # the committer runs through the fault
    return pid, threads


def _gave_up(committer: Child, threads: set[int]) -> bool:
    """True once the committer dropped the producer it had (its librdkafka threads ended:
    the client's timeout expired and it started over), or it exited."""
    if committer.poll() is not None:
        return True
    return not threads <= rdkafka_threads(committer.pid)


def _finish_and_retry(h: Harness, committer: Child) -> tuple[int, str, Any]:
    """Let the committer end by itself; retry the commit when it did not finish the job."""
    try:
        code, _out, err = finish(committer)
    finally:
        kill_child(committer)
    cid = h.ledger.unfinished(h.pipeline.name)
    retry = h.commit(cid.checkpoint_id) if cid is not None else None
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state is CheckpointState.COMMITTED, err[-3000:]
    return code, err, retry


@pytest.mark.parametrize(
    "step",
    [
        "commit.after_begin",  # producing: the rest of the records and their partitions' adds
        "commit.before_end_txn",  # committing: the EndTxn request itself
    ],
)
def test_broker_crash_restart_with_request_in_flight(
    broker: LocalKafka, tmp_path: Path, spark: Any, step: str
) -> None:
    h = _harness(broker, tmp_path, spark, short=False)
    committer = paused_commit(h, step)
    try:
        _resume_into_stopped_broker(broker, committer)
        crash_restart(broker)  # the unread request dies with the broker
    finally:
        sigcont(committer.pid)
    _finish_and_retry(h, committer)
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    h.ledger.close()


def test_broker_stopped_past_request_timeout_while_producing(
    broker: LocalKafka, tmp_path: Path, spark: Any
) -> None:
    h = _harness(broker, tmp_path, spark, short=True)
    committer = paused_commit(h, "commit.after_begin")
    pid = broker_pid(broker)
    try:
        _pid, threads = _resume_into_stopped_broker(broker, committer)
        wait_for(lambda: _gave_up(committer, threads), "the committer to give up", timeout=120)
    finally:
        sigcont(pid)
        sigcont(committer.pid)
    _finish_and_retry(h, committer)
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    h.ledger.close()


def test_ambiguous_commit_from_a_real_timeout(broker: LocalKafka, tmp_path: Path, spark: Any) -> None:
    """EndTxn reaches a stopped broker; the client times out on ``commit_transaction`` (an
    ambiguous outcome) and starts over; then the broker resumes and processes the stale
    EndTxn. The retry must decide by the marker: never abort, never publish twice."""
    h = _harness(broker, tmp_path, spark, short=True)
    committer = paused_commit(h, "commit.before_end_txn")
    pid = broker_pid(broker)
    try:
        _pid, threads = _resume_into_stopped_broker(broker, committer)
        wait_for(lambda: _gave_up(committer, threads), "commit_transaction to time out", timeout=120)
    finally:
        sigcont(pid)
        sigcont(committer.pid)
    code, err, retry = _finish_and_retry(h, committer)
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    print(f"ambiguous commit: committer exit {code}, retry {retry}, stderr tail: {err[-500:]}")
    h.ledger.close()


def test_a_timed_out_commit_drops_its_producer_after_one_timeout(
    broker: LocalKafka, tmp_path: Path, spark: Any
) -> None:
    """EndTxn reaches a stopped broker and ``commit_transaction`` times out (one
    transaction timeout, ``SHORT_TXN_MS``). The producer whose EndTxn may still land is
    dropped right then (its librdkafka threads end while the broker is still stopped), not
    asked to commit again; a new producer's init_transactions, once the broker is back,
    fences the old one's late request and the marker decides: the committer finishes by
    itself, each source record once. Measured from the moment the EndTxn sat unread in the
    broker's socket; the old code repeated commit_transaction on the same producer for up
    to twice the timeout first."""
    h = _harness(broker, tmp_path, spark, short=True)
    committer = paused_commit(h, "commit.before_end_txn")
    pid = broker_pid(broker)
    try:
        _pid, threads = _resume_into_stopped_broker(broker, committer)
        sent = time.monotonic()
        wait_for(lambda: _gave_up(committer, threads), "the timed-out producer to be dropped", timeout=60)
        dropped_after = time.monotonic() - sent
    finally:
        sigcont(pid)
        sigcont(committer.pid)
    code, err, retry = _finish_and_retry(h, committer)
    assert dropped_after < 1.6 * SHORT_TXN_MS / 1000, (
        f"the producer was dropped {dropped_after:.1f} s after its EndTxn was sent (one "
        f"transaction timeout is {SHORT_TXN_MS / 1000:.0f} s): commit_transaction was repeated on it"
    )
    assert code == 0 and retry is None, err[-3000:]  # the committer decided by the marker itself
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    print(f"timed-out commit: producer dropped {dropped_after:.2f} s after its EndTxn was sent")
    h.ledger.close()
