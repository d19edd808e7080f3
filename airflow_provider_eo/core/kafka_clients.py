"""The Kafka side of a commit as one object passed in: producers, markers, offsets, topic
settings (:class:`KafkaClients`); :data:`REAL_KAFKA` talks to the cluster, unit tests pass a
fake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from airflow_provider_eo.kafka.publisher import DeliveryFailures


class KafkaClients(Protocol):
    """The Kafka side of a shard transaction, made fakeable (Flink passes a producer
    factory to its committer for the same reason)."""

    def producer(
        self,
        config: Mapping[str, Any],
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
    ) -> Any:
        """A fresh transactional producer (confluent_kafka.Producer's interface)."""

    def committed_marks(
        self, config: Mapping[str, Any], group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata. ``stable``: a pending
        transactional offset commit of one of ``partitions`` is waited out (until its
        transaction ends, or the read times out); else only what is committed now is read,
        without waiting."""

    def marks_elsewhere(
        self, config: Mapping[str, Any], group: str, sink_topic: str
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata on every topic but
        ``sink_topic`` (not waiting for open transactions)."""

    def group_metadata(self, config: Mapping[str, Any], group: str) -> Any:
        """Consumer-group metadata for ``send_offsets_to_transaction``."""

    def last_published_checkpoint(
        self, config: Mapping[str, Any], topic: str, partition: int, pipeline_name: str, identity: str
    ) -> int:
        """The highest checkpoint of this pipeline identity in ``topic[partition]``'s
        committed output (-1: none)."""

    def partition_count(self, config: Mapping[str, Any], topic: str) -> int:
        """Partitions of ``topic``."""

    def topic_max_message_bytes(self, config: Mapping[str, Any], topic: str, default: int) -> int:
        """The topic's ``max.message.bytes``."""

    def open_transactions(self, config: Mapping[str, Any], topic: str) -> dict[int, tuple[int, int]]:
        """Partitions of ``topic`` whose last stable offset is below the high watermark:
        partition -> (stable, high)."""


class RealKafka:
    """:class:`KafkaClients` on the real cluster (stateless, so picklable)."""

    def producer(
        self,
        config: Mapping[str, Any],
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
    ) -> Any:
        """:func:`kafka.publisher.new_producer`."""
        from airflow_provider_eo.kafka.publisher import new_producer

        return new_producer(config, transactional_id, timeout_ms, on_failure, topic_max_bytes=topic_max_bytes)

    def committed_marks(
        self, config: Mapping[str, Any], group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks`."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks(config, group, partitions, stable=stable)

    def marks_elsewhere(
        self, config: Mapping[str, Any], group: str, sink_topic: str
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks_everywhere` but ``sink_topic``."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks_everywhere(config, group, exclude=[sink_topic])

    def group_metadata(self, config: Mapping[str, Any], group: str) -> Any:
        """:func:`kafka.publisher.group_metadata`."""
        from airflow_provider_eo.kafka.publisher import group_metadata

        return group_metadata(config, group)

    def last_published_checkpoint(
        self, config: Mapping[str, Any], topic: str, partition: int, pipeline_name: str, identity: str
    ) -> int:
        """:func:`kafka.audit.last_published_checkpoint` (reads the partition's tail)."""
        from airflow_provider_eo.kafka import audit

        return audit.last_published_checkpoint(dict(config), topic, partition, pipeline_name, identity)

    def partition_count(self, config: Mapping[str, Any], topic: str) -> int:
        """:func:`kafka.admin.partition_count`."""
        from airflow_provider_eo.kafka import admin

        return admin.partition_count(config, topic)

    def topic_max_message_bytes(self, config: Mapping[str, Any], topic: str, default: int) -> int:
        """:func:`kafka.admin.topic_max_message_bytes`."""
        from airflow_provider_eo.kafka import admin

        return admin.topic_max_message_bytes(config, topic, default)

    def open_transactions(self, config: Mapping[str, Any], topic: str) -> dict[int, tuple[int, int]]:
        """Last stable offset vs high watermark of every partition, read_committed."""
        from airflow_provider_eo.kafka import admin

        stable, high = admin.sink_offsets(config, topic, admin.partition_count(config, topic))
        return {p: (stable[p], high[p]) for p in sorted(high) if stable.get(p, high[p]) < high[p]}


REAL_KAFKA = RealKafka()
