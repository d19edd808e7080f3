"""``eo recover``: lingering open transactions on the sink are resolved safely.

A producer that dies with its transaction open holds back every read_committed consumer of
the sink until the broker's transaction timeout (here: 10 minutes). ``eo recover`` fences
the pipeline's transactional ids (the zombie's transaction is aborted), commits a PREPARED
checkpoint by its markers, and says when what stays open is not ours.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from eo_faultlib import kill_child
from eo_harness import Harness, parse_json_line

from airflow_provider_eo import names
from airflow_provider_eo.core.doctor import run_doctor
from airflow_provider_eo.kafka.admin import sink_offsets
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ZOMBIE = """
import sys
from confluent_kafka import Producer
conf = {"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
        "transaction.timeout.ms": 600000}
p = Producer(conf)
p.init_transactions(30)
p.begin_transaction()
for i in range(5):
    p.produce(sys.argv[3], key=b"zombie", value=b"zombie-%d" % i, partition=i % int(sys.argv[4]))
p.flush(30)
print("open", flush=True)
sys.stdin.read()  # hold the transaction open until killed
"""


def _zombie(h: Harness, transactional_id: str) -> subprocess.Popen[str]:
    """A producer left with an open transaction of 5 records on the sink (killed, never
    aborting): what a committer SIGKILLed mid-transaction leaves behind."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ZOMBIE,
            h.config["bootstrap.servers"],
            transactional_id,
            h.pipeline.sink_topic,
            "3",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    proc.kill()
    proc.wait(timeout=30)
    return proc


def _open_partitions(h: Harness) -> list[int]:
    stable, high = sink_offsets(h.config, h.pipeline.sink_topic, 3)
    return [p for p in high if stable[p] < high[p]]


def _recover(h: Harness, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = h.cli("recover", *args)
    return proc.returncode, (parse_json_line(proc.stdout) if proc.stdout.strip() else {}), proc.stderr


def test_recover_aborts_a_zombie_transaction_of_a_finished_checkpoint(harness: Callable[..., Any]) -> None:
    h = harness()
    h.produce(50)
    h.drain()
    cp = h.ledger.last_committed(h.pipeline.name)
    assert cp is not None and cp.commit_plan is not None
    txn_id = names.plan_transactional_id(cp.commit_plan, h.pipeline.name, 0)
    _zombie(h, txn_id)
    assert _open_partitions(h), "the zombie's transaction is open"

    finding = next(f for f in run_doctor(h.pipeline).findings if f.check == "open-transactions")
    assert finding.severity == "warn" and "eo recover" in finding.change

    rc, summary, err = _recover(h)
    assert rc == 0, err
    assert txn_id in summary["fenced"] and summary["open_before"] and not summary["open_after"]
    assert summary["committed"] is None and f"fenced {txn_id}" in err
    assert not _open_partitions(h)  # long before the zombie's 10-minute timeout
    h.assert_exactly_once(expected_records=50)  # the zombie's 5 records were aborted


def test_recover_commits_a_prepared_checkpoint_whose_committer_died(harness: Callable[..., Any]) -> None:
    h = harness()
    h.produce(40)
    planned, committer = h.paused_commit()  # transaction open, every record sent
    kill_child(committer)
    assert _open_partitions(h)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.PREPARED
    # While its lease runs, a dead committer looks like a live one: recover refuses to fence it.
    rc, _summary, err = _recover(h)
    assert rc == 1 and f"checkpoint {planned.checkpoint_id} is being committed by " in err, err
    assert _open_partitions(h)  # nothing was fenced
    # What its lease running out does.
    holder = h.ledger.get(h.pipeline.name, planned.checkpoint_id).commit_owner
    assert holder is not None and (names.lease_owner_process(holder) or ("", 0))[1] == committer.pid
    h.ledger.release_commit_lease(h.pipeline.name, planned.checkpoint_id, owner=holder)

    rc, summary, err = _recover(h)
    assert rc == 0, err
    assert summary["committed"] == planned.checkpoint_id and summary["published"] == 40
    assert not summary["open_after"]
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=40)

    rc, again, err = _recover(h)  # nothing left to do
    assert rc == 0, err
    assert again["committed"] is None and not again["open_before"] and again["published"] == 0
    h.assert_exactly_once(expected_records=40)


def test_recover_reports_a_foreign_open_transaction(harness: Callable[..., Any]) -> None:
    h = harness()
    h.produce(10)
    h.drain()
    _zombie(h, "someone-else.0")
    rc, summary, err = _recover(h, "--wait", "1")
    assert rc == 1
    assert summary["open_after"]
    assert "not this pipeline's" in err and f"find-hanging --topic {h.pipeline.sink_topic}" in err
    # Nothing of ours changed (the foreign transaction stays open, so no read_committed audit).
    assert summary["committed"] is None and h.ledger.unfinished(h.pipeline.name) is None


def test_recover_commits_a_spark_mode_pipeline_through_spark(harness: Callable[..., Any]) -> None:
    """A ``commit_mode="spark"`` pipeline whose committer died inside its transaction (every
    record sent): ``eo recover`` commits the PREPARED checkpoint in Spark tasks (a local
    session in the recover process), each source record once."""
    h = harness(commit_mode="spark", commit_shards=3)
    h.produce(40)
    # The committer that dies: an `eo commit --commit-mode local` (a spark-mode task would
    # stop its Python worker, not the committer).
    planned, committer = h.with_(commit_mode="local").paused_commit()
    kill_child(committer)
    assert _open_partitions(h)
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.PREPARED

    rc, summary, err = _recover(h, "--force-live")  # the dead committer's lease still runs
    assert rc == 0, err
    assert summary["committed"] == planned.checkpoint_id and summary["published"] == 40, summary
    assert not summary["open_after"]
    assert "committing its shards in this process" not in err, err
    done = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert done.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=40)
    assert len(h.sink_records()) == 40  # read_committed, against the 40 source records
