"""A shard the ledger records COMMITTED is published for good, after its commit marker
expired too: ``eo abort`` refuses the checkpoint instead of replanning a range part of which
is already in the sink.

Real broker, real Spark prepare, a real ``eo commit`` child SIGKILLed inside its second
shard's transaction; the markers' expiry is the marker group's deletion (what the broker does
``offsets.retention.minutes`` after the group's last commit). Exactly-once is counted against
the SOURCE topic: a read_committed consumer of the sink, record by source position.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, finish, marker, spawn_commit
from eo_harness import EO, Harness
from eo_source_sink import assert_sink_is_source_exactly_once, compare_source_and_sink

from airflow_provider_eo import names
from airflow_provider_eo.kafka.admin import admin_client
from airflow_provider_eo.ledger import CheckpointState, ShardState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 2000


def _expire_markers(h: Harness) -> None:
    """The marker group and its offsets go, as retention removes them."""
    group = names.marker_group(h.pipeline)
    futures = admin_client(h.pipeline.kafka).delete_consumer_groups([group], request_timeout=30)
    futures[group].result(timeout=60)


def _eo(h: Harness, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    for key in ("EO_FAULT", "EO_FAULT_ACTION", "EO_FAULT_HIT"):
        env.pop(key, None)
    cmd = [EO, command, "eo_test_pipelines:from_env", *args, "--json"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_abort_after_the_markers_expired_keeps_a_committed_shard(harness: Callable[..., Harness]) -> None:
    h = harness(source_partitions=2, sink_partitions=2, commit_shards=2)
    h.produce(RECORDS)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    cid = planned.checkpoint_id
    # Shard 0 commits; the committer dies inside shard 1's transaction (records produced).
    rc, _out, err = finish(spawn_commit(h, fault="commit.before_commit_txn", action="kill", hit=2))
    assert rc == -signal.SIGKILL, err[-3000:]
    cp = h.ledger.get(h.pipeline.name, cid)
    assert cp.state is CheckpointState.PREPARED
    assert [(s.shard, s.state) for s in cp.shards] == [(0, ShardState.COMMITTED), (1, ShardState.PENDING)]
    shard0 = next(s.records for s in cp.shards if s.shard == 0)
    assert shard0 > 0 and marker(h.pipeline, 0) == cid
    _expire_markers(h)
    assert [marker(h.pipeline, s) for s in (0, 1)] == [-1, -1]

    aborted = _eo(h, "abort", str(cid), "--reason", "transaction timed out", "--force-live")
    assert aborted.returncode != 0, (
        f"the abort exited 0 with shard 0 ({shard0} records) published: {aborted.stdout[-2000:]}"
    )
    said = " ".join(aborted.stderr.split())  # the console folds long lines
    assert "shard 0 (recorded COMMITTED in the ledger)" in said, said[-3000:]
    assert f"checkpoint {cid}: transaction timed out" in said and "Nothing was aborted" in said
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    report = compare_source_and_sink(
        h.config, list(h.pipeline.source_topics), h.pipeline.sink_topic, h.pipeline.name
    )
    assert (report.source, report.sink, len(report.duplicated)) == (RECORDS, shard0, 0), report.describe()

    # The way out the refusal names: finish the commit (the dead committer's lease is still
    # running, and it is known to be dead).
    recovered = _eo(h, "recover", "--force-live")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.COMMITTED
    h.drain()
    assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
