"""The Kafka side of the protocol as one object passed in (:class:`KafkaClients`): the
source's partitions and offsets and the consumer group's (the plan), producers, commit
markers, the sink's tail and topic settings (the sink guard, the commit);
:data:`REAL_KAFKA` talks to the cluster, unit tests pass a fake."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from airflow_provider_eo.kafka.publisher import DeliveryFailures

TP = tuple[str, int]


class KafkaClients(Protocol):
    """The Kafka side of planning and committing a checkpoint, made fakeable (Flink passes a
    producer factory to its committer for the same reason)."""

    def partitions_of(self, config: Mapping[str, Any], topics: Sequence[str]) -> dict[str, list[int]]:
        """Partition ids per topic; a missing topic is an error naming it."""

    def list_offsets(
        self, config: Mapping[str, Any], partitions: Iterable[TP], *, spec: str, timeout_s: float = 60.0
    ) -> dict[TP, int]:
        """``earliest`` (the log start) or ``latest`` (the last stable offset) per partition,
        within ``timeout_s``."""

    def offsets_for_timestamp(
        self, config: Mapping[str, Any], partitions: Iterable[TP], timestamp_ms: int
    ) -> dict[TP, int]:
        """The first offset at or after ``timestamp_ms`` per partition (the log end if none)."""

    def committed_offsets(
        self, config: Mapping[str, Any], group: str, partitions: Iterable[TP]
    ) -> dict[TP, int]:
        """Committed offsets of consumer group ``group`` (partitions without one left out)."""

    def tail_records(self, config: Mapping[str, Any], topic: str, *, per_partition: int) -> list[Any]:
        """Up to the last ``per_partition`` committed records of every partition of ``topic``
        (confluent_kafka.Message's interface: ``headers()``)."""

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

    def write_denied_topic(self, config: Mapping[str, Any], topics: Sequence[str]) -> str | None:
        """The first of ``topics`` the broker says this principal may not WRITE (None: it
        may write them all, or the broker will not say)."""


class RealKafka:
    """:class:`KafkaClients` on the real cluster (stateless, so picklable)."""

    def partitions_of(self, config: Mapping[str, Any], topics: Sequence[str]) -> dict[str, list[int]]:
        """:func:`kafka.admin.partitions_of`."""
        from airflow_provider_eo.kafka import admin

        return admin.partitions_of(config, topics)

    def list_offsets(
        self, config: Mapping[str, Any], partitions: Iterable[TP], *, spec: str, timeout_s: float = 60.0
    ) -> dict[TP, int]:
        """:func:`kafka.admin.list_offsets`."""
        from airflow_provider_eo.kafka import admin

        return admin.list_offsets(config, partitions, spec=spec, timeout_s=timeout_s)

    def offsets_for_timestamp(
        self, config: Mapping[str, Any], partitions: Iterable[TP], timestamp_ms: int
    ) -> dict[TP, int]:
        """:func:`kafka.admin.offsets_for_timestamp`."""
        from airflow_provider_eo.kafka import admin

        return admin.offsets_for_timestamp(config, partitions, timestamp_ms)

    def committed_offsets(
        self, config: Mapping[str, Any], group: str, partitions: Iterable[TP]
    ) -> dict[TP, int]:
        """:func:`kafka.admin.committed_group_offsets`."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_offsets(config, group, partitions)

    def tail_records(self, config: Mapping[str, Any], topic: str, *, per_partition: int) -> list[Any]:
        """:func:`kafka.tail.tail_records`."""
        from airflow_provider_eo.kafka.tail import tail_records

        return tail_records(dict(config), topic, per_partition=per_partition)

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

    def write_denied_topic(self, config: Mapping[str, Any], topics: Sequence[str]) -> str | None:
        """:func:`kafka.admin.write_denied_topic`."""
        from airflow_provider_eo.kafka import admin

        return admin.write_denied_topic(config, topics)


REAL_KAFKA = RealKafka()
