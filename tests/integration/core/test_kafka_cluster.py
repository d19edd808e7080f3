"""Exactly once on a three-broker Kafka cluster (KRaft quorum of three, replication factor 3,
``min.insync.replicas=2`` for the data, the transaction state log and the offsets topic),
with the PostgreSQL ledger.

A commit is stopped with its transaction open and every record sent; then the broker that
coordinates its transactional id is SIGKILLed together with the committer (a crashed commit
task: its retry finishes the checkpoint), and for the next checkpoint the leader of a sink
partition is SIGKILLed while the committer goes on. Exactly once both times. Each killed
broker is restarted and, once every replica is back in sync, still nothing is lost or
duplicated. Before that, the offset look-ups of a process's shared admin client follow a
partition's leadership when its leader dies.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_faultlib import finish, kill_child, sigcont
from eo_harness import Harness, wait_for
from eo_kafka_cluster import LocalCluster, txn_state_partition

from airflow_provider_eo import names
from airflow_provider_eo.errors import KafkaAdminError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.publisher import close_producers
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.cluster,
    pytest.mark.timeout(900),
]

PARTITIONS = 3
RECORDS = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("kafka-cluster"))
    c.up()
    try:
        yield c
    finally:
        admin.close_shared_clients()  # while the brokers still answer (see the function)
        close_producers()  # the transactional producers local commits kept, likewise
        c.down()


def test_offset_lookups_follow_a_dead_leaders_successor(cluster: LocalCluster) -> None:
    # librdkafka sends ListOffsets to the leader in its client's metadata cache, and a
    # shared admin client (which subscribes to nothing) does not refresh it when that leader
    # dies: each request failed and the partition came back as offset -1001 with no error,
    # for minutes (a commit's read-back found "no offsets" until it gave up).
    config = {"bootstrap.servers": cluster.bootstrap}
    topic = f"lookup-{uuid.uuid4().hex[:6]}"
    admin.ensure_topic(config, topic, partitions=PARTITIONS, replication_factor=3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(7):
        producer.produce(topic, value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    tp = (topic, 0)
    assert admin.list_offsets(config, [tp], spec="latest") == {tp: 7}  # the leader now cached
    victim = cluster.leader_of(topic, 0)
    cluster.kill(victim)
    try:
        wait_for(lambda: cluster.leader_of(topic, 0) != victim, "a new leader", timeout=60)
        assert admin.list_offsets(config, [tp], spec="latest", timeout_s=60) == {tp: 7}
        assert admin.list_offsets(config, [tp], spec="earliest", timeout_s=60) == {tp: 0}
        assert admin.sink_offsets(config, topic, PARTITIONS) == ({0: 7, 1: 0, 2: 0}, {0: 7, 1: 0, 2: 0})
    finally:
        cluster.restart(victim)
        wait_for(
            lambda: cluster.isr_complete({topic: PARTITIONS}), f"node {victim} back in sync", timeout=120
        )


def _kill_during_commit(
    h: Harness,
    cluster: LocalCluster,
    victim_of: Callable[[CheckpointRecord], int],
    expected: int,
    *,
    kill_committer: bool,
) -> tuple[int, int]:
    """Pause a commit with its transaction open, SIGKILL the broker ``victim_of`` names (and,
    with ``kill_committer``, the committer too: a crashed commit task), let the commit go on
    or retry it, restart the broker. Returns (victim, committer's exit status)."""
    planned, committer = h.paused_commit()
    try:
        checkpoint = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
        victim = victim_of(checkpoint)
        cluster.kill(victim)
        if kill_committer:
            kill_child(committer)
    finally:
        sigcont(committer.pid)
    try:
        rc, _out, err = finish(committer, timeout=300)
    finally:
        kill_child(committer)
    state = h.ledger.get(h.pipeline.name, planned.checkpoint_id).state
    if rc != 0 or state is not CheckpointState.COMMITTED:
        # The task retry resumes the same checkpoint. With a broker just killed, a retry can
        # still fail to read the cluster's metadata in time on a loaded machine (seen once with
        # two test sessions sharing two cores): as in Airflow, the task is retried again; every
        # try must publish nothing twice, and the assertions below count the source records.
        for attempt in range(1, 4):
            try:
                h.commit(planned.checkpoint_id)
                break
            except KafkaAdminError:
                if attempt == 3:
                    raise
    final = h.ledger.get(h.pipeline.name, planned.checkpoint_id).state
    assert final is CheckpointState.COMMITTED, err[-2000:]
    # Plan may have sized the checkpoint below the input (the rate measured from a commit
    # that met a dying broker is low): the rest goes in the next checkpoints.
    h.drain()
    h.assert_exactly_once(expected_records=expected)  # with the broker still down

    cluster.restart(victim)
    topics = {h.pipeline.source_topics[0]: PARTITIONS, h.pipeline.sink_topic: PARTITIONS}
    wait_for(lambda: cluster.isr_complete(topics), f"node {victim}'s replicas to catch up", timeout=120)
    h.assert_exactly_once(expected_records=expected)  # nothing lost across the restart
    return victim, rc


def test_commit_survives_killing_the_coordinator_then_a_leader(
    cluster: LocalCluster, pg_fresh_url: str, tmp_path: Path, spark: Any
) -> None:
    config = {"bootstrap.servers": cluster.bootstrap}
    source, sink = f"src-{uuid.uuid4().hex[:6]}", f"sink-{uuid.uuid4().hex[:6]}"
    for topic in (source, sink):
        admin.ensure_topic(config, topic, partitions=PARTITIONS, replication_factor=3)
    pipeline = Pipeline(
        name=f"cluster-{uuid.uuid4().hex[:6]}",
        kafka=config,
        source_topics=[source],
        sink_topic=sink,
        ledger_url=pg_fresh_url,
        staging_dir=str(tmp_path / "staging"),
    )
    h = Harness(pipeline, config, spark)
    try:
        # 1. The transaction coordinator of the commit's transactional id dies mid-commit.
        def coordinator(cp: CheckpointRecord) -> int:
            assert cp.commit_plan is not None, "the commit plan is frozen before the transaction"
            txn_id = names.plan_transactional_id(cp.commit_plan, pipeline.name, 0)
            return cluster.transaction_coordinator(txn_id)

        h.produce(RECORDS)
        # The commit task dies with it: the retry meets a new coordinator that still holds
        # the open transaction, fences it and publishes the checkpoint once.
        victim, rc = _kill_during_commit(h, cluster, coordinator, RECORDS, kill_committer=True)
        assert rc == -9
        print(f"coordinator kill: node {victim}, committer killed too, retried")

        # The coordinator formula is Kafka's: checked against the group coordinator the
        # brokers report for the pipeline's consumer group (same hash, __consumer_offsets).
        group = pipeline.group_id
        described = admin.admin_client(config).describe_consumer_groups([group])[group].result(timeout=30)
        assert described.coordinator.id == cluster.leader_of("__consumer_offsets", txn_state_partition(group))

        # 2. The leader of a sink partition dies mid-commit.
        h.produce(RECORDS, start=RECORDS)
        victim, rc = _kill_during_commit(
            h, cluster, lambda cp: cluster.leader_of(sink, 0), 2 * RECORDS, kill_committer=False
        )
        print(f"leader kill: node {victim}, paused committer exited {rc}")

        # 3. The pipeline goes on normally with every broker back.
        h.produce(RECORDS, start=2 * RECORDS)
        h.drain()
        h.assert_exactly_once(expected_records=3 * RECORDS)
    finally:
        h.ledger.close()
