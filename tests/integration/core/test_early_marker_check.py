"""The commit's early marker check against a real broker: it reads every shard's committed
marker up front (a marker past the checkpoint means an older ledger) and must never wait
on a transaction another committer left open (docs/design.md §2, commit)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest
from eo_faultlib import sigcont
from eo_harness import Harness, process_state, wait_for

from airflow_provider_eo import names
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 200

#: A committer of one shard that began its transaction, sent the shard's marker (a pending
#: offset commit in the marker group) and then stopped (SIGSTOP): what a committer paused or
#: killed between its send_offsets_to_transaction and its commit leaves on the broker.
STOPPED_COMMITTER = textwrap.dedent(
    """
    import json, os, signal, sys
    from confluent_kafka import Consumer, Producer, TopicPartition
    a = json.loads(sys.argv[1])
    producer = Producer({**a["config"], "transactional.id": a["tid"], "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    producer.begin_transaction()
    group = Consumer({**a["config"], "group.id": a["group"]}).consumer_group_metadata()
    marker = TopicPartition(a["sink"], a["shard"], a["checkpoint"], metadata=a["metadata"])
    producer.send_offsets_to_transaction([marker], group, 30)
    print("sent", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    """
)


def test_the_early_check_does_not_wait_on_a_stopped_committers_pending_marker(
    harness: Callable[..., Harness],
) -> None:
    """A committer of shard 0 stopped inside its transaction after it sent the marker, with
    no record on sink partition 0: the sink shows no open transaction there, but the marker
    group's partition holds the pending marker. The next commit's early check used to read
    that marker stable and wait 30 s (until it gave up; the transaction's timeout is 60 s).
    Now the commit finishes well inside that, and each source record is in the sink once."""
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3, transaction_timeout_ms=60_000)
    h.produce(RECORDS, keys=11)
    planned = h.plan()
    cp = h.prepare(planned.checkpoint_id).checkpoint
    plan = h.ledger.get(h.pipeline.name, cp.checkpoint_id).commit_plan
    assert plan is not None
    identity = h.ledger.get_pipeline(h.pipeline.name).identity
    args = {
        "config": {"bootstrap.servers": h.config["bootstrap.servers"]},
        "tid": names.plan_transactional_id(plan, h.pipeline.name, 0),
        "group": plan.marker_group,
        "sink": plan.sink_topic,
        "shard": 0,
        "checkpoint": cp.checkpoint_id,
        "metadata": names.marker_metadata(identity),
    }
    stopped = subprocess.Popen(
        [sys.executable, "-c", STOPPED_COMMITTER, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: process_state(stopped.pid) == "T", "the committer to stop inside its transaction")
        started = time.monotonic()
        result = h.commit(cp.checkpoint_id)
        took = time.monotonic() - started
        assert result.checkpoint.state is CheckpointState.COMMITTED
        # The old early check waited 30 s here; the commit itself takes a few seconds.
        assert took < 15.0, f"the commit took {took:.1f} s: a read waited on the stopped committer"
    finally:
        stopped.kill()
        sigcont(stopped.pid)
        stopped.wait(30)
    h.assert_exactly_once(expected_records=RECORDS)
    print(f"commit beside a stopped committer's pending marker: {took:.2f} s")
