"""A three-node Kafka cluster on 127.0.0.1 for the cluster tests: every node is a KRaft
broker and a voter of the controller quorum, internal topics and data topics are
replicated three times with ``min.insync.replicas=2``.

Each node is a :class:`LocalKafka` with its own folder, ports and ``node.id``, formatted
with one shared cluster id; the nodes start together (none is ready before a quorum
forms). ``kill`` SIGKILLs one node's process group, ``restart`` brings it back on the same
ports and data.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from eo_harness import wait_for

from airflow_provider_eo.stack.kafka import LocalKafka, free_ports, new_cluster_id, pid_alive, port_in_use

# Replication of everything the protocol writes: data, transaction state, group offsets.
CLUSTER_CONFIG = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # Failover within seconds, not the 18 s / 9 s defaults.
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    "controller.quorum.fetch.timeout.ms": "4000",
    "controller.quorum.election.timeout.ms": "1500",
}
TXN_STATE_PARTITIONS = 10


class ClusterNode(LocalKafka):
    """One node (broker and controller) of a :class:`LocalCluster`."""

    def __init__(
        self, *, home: Path, node_id: int, port: int, controller_port: int, voters: str, cluster_id: str
    ) -> None:
        super().__init__(home=home, port=port, cluster_id=cluster_id, extra_config=CLUSTER_CONFIG)
        self.node_id = node_id
        self.controller_port = controller_port
        self.voters = voters

    def _ports(self) -> tuple[int, int]:
        assert self.requested_port is not None
        return self.requested_port, self.controller_port

    def _write_config(self, port: int, controller: int) -> Path:
        path = super()._write_config(port, controller)
        lines = path.read_text().splitlines()
        props = dict(line.split("=", 1) for line in lines if "=" in line)
        props.update(
            {
                "node.id": str(self.node_id),
                "controller.quorum.voters": self.voters,
                "transaction.state.log.num.partitions": str(TXN_STATE_PARTITIONS),
            }
        )
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path


class LocalCluster:
    """Three :class:`ClusterNode` processes forming one cluster."""

    def __init__(self, home: Path, nodes: int = 3) -> None:
        picked = free_ports(2 * nodes)  # distinct: two listeners on one port fail the format
        ports = list(zip(picked[::2], picked[1::2], strict=True))
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        cluster_id = new_cluster_id()
        self.nodes = [
            ClusterNode(
                home=home / f"node{i + 1}",
                node_id=i + 1,
                port=p,
                controller_port=c,
                voters=voters,
                cluster_id=cluster_id,
            )
            for i, (p, c) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        """All nodes' client listeners."""
        return ",".join(f"127.0.0.1:{n.requested_port}" for n in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    def up(self, timeout_s: float = 180.0) -> None:
        """Start every node at once and wait until each answers."""
        errors: list[BaseException] = []

        def start(node: ClusterNode) -> None:
            try:
                node.up(timeout_s=timeout_s)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(n,)) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.down()
            raise errors[0]

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (no clean shutdown: its leaderships move by election)."""
        info = self.node(node_id).info()
        assert info is not None, f"node {node_id} is not running"
        os.killpg(info.pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(info.pid), f"node {node_id} to die", timeout=30)

    def restart(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Start a killed node again on its ports and data."""
        node = self.node(node_id)
        wait_for(
            lambda: not port_in_use(node.requested_port or 0), f"node {node_id}'s port to be free", timeout=60
        )
        node.up(timeout_s=timeout_s)

    def down(self) -> None:
        """SIGKILL every node and delete the data (a test cluster: nothing to keep, and a
        controlled shutdown of a three-node quorum takes tens of seconds)."""
        for node in self.nodes:
            info = node.info()
            if info is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(info.pid, signal.SIGKILL)
                wait_for(lambda pid=info.pid: not pid_alive(pid), f"node {node.node_id} to die", timeout=30)
            node.wipe()

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic[partition]`` now."""
        md = self.admin().list_topics(topic=topic, timeout=10)
        return int(md.topics[topic].partitions[partition].leader)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node id coordinating ``transactional_id``: the leader of its
        ``__transaction_state`` partition (Kafka's ``abs(id.hashCode) % partitions``)."""
        return self.leader_of("__transaction_state", txn_state_partition(transactional_id))

    def isr_complete(self, topics: Mapping[str, int]) -> bool:
        """Whether every partition of ``topics`` (name -> partition count) has all 3 replicas
        in sync again."""
        md = self.admin().list_topics(timeout=10)
        for topic, count in topics.items():
            meta = md.topics.get(topic)
            if meta is None or len(meta.partitions) != count:
                return False
            if any(len(p.isrs) < len(self.nodes) for p in meta.partitions.values()):
                return False
        return True


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit signed overflow)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def txn_state_partition(transactional_id: str, partitions: int = TXN_STATE_PARTITIONS) -> int:
    """Kafka's ``TransactionStateManager.partitionFor``: ``Utils.abs(hashCode) % partitions``."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def describe(cluster: LocalCluster) -> dict[str, Any]:
    """Node ids and pids, for assertion messages."""
    return {n.node_id: (n.info().pid if n.info() else None) for n in cluster.nodes}
