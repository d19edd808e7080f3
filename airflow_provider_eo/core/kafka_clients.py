"""The Kafka side of the protocol as one object passed in (:class:`KafkaClients`): the
source's partitions and offsets and the consumer group's (the plan), producers, commit
markers, the sink's tail and topic settings (the sink guard, the commit);
:class:`RealKafka` talks to the cluster (built once per pipeline and handed on), unit
tests pass a fake."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import DeliveryFailures

TP = tuple[str, int]


class KafkaClients(Protocol):
    """The Kafka side of planning and committing a checkpoint, made fakeable (Flink passes a
    producer factory to its committer for the same reason)."""

    def partitions_of(self, topics: Sequence[str]) -> dict[str, list[int]]:
        """Partition ids per topic; a missing topic is an error naming it."""

    def list_offsets(self, partitions: Iterable[TP], *, spec: str, timeout_s: float = 60.0) -> dict[TP, int]:
        """``earliest`` (the log start) or ``latest`` (the last stable offset) per partition,
        within ``timeout_s``."""

    def offsets_for_timestamp(self, partitions: Iterable[TP], timestamp_ms: int) -> dict[TP, int]:
        """The first offset at or after ``timestamp_ms`` per partition (the log end if none)."""

    def committed_offsets(self, group: str, partitions: Iterable[TP]) -> dict[TP, int]:
        """Committed offsets of consumer group ``group`` (partitions without one left out)."""

    def tail_records(self, topic: str, *, per_partition: int) -> list[Any]:
        """Up to the last ``per_partition`` committed records of every partition of ``topic``
        (confluent_kafka.Message's interface: ``headers()``)."""

    def producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
        config: Mapping[str, Any] | None = None,
    ) -> Any:
        """A fresh transactional producer (confluent_kafka.Producer's interface). ``config``:
        a shard's own producer settings (the pipeline's with its dead-letter topic's limits)
        instead of these clients' config."""

    def committed_marks(
        self, group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata. ``stable``: a pending
        transactional offset commit of one of ``partitions`` is waited out (until its
        transaction ends, or the read times out); else only what is committed now is read,
        without waiting."""

    def marks_elsewhere(self, group: str, sink_topic: str) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata on every topic but
        ``sink_topic`` (not waiting for open transactions)."""

    def group_metadata(self, group: str) -> Any:
        """Consumer-group metadata for ``send_offsets_to_transaction``."""

    def last_published_checkpoint(self, topic: str, partition: int, pipeline_name: str, identity: str) -> int:
        """The highest checkpoint of this pipeline identity in ``topic[partition]``'s
        committed output (-1: none)."""

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``."""

    def topic_max_message_bytes(self, topic: str, default: int) -> int:
        """The topic's ``max.message.bytes``."""

    def open_transactions(self, topic: str) -> dict[int, tuple[int, int]]:
        """Partitions of ``topic`` whose last stable offset is below the high watermark:
        partition -> (stable, high)."""

    def write_denied_topic(self, topics: Sequence[str]) -> str | None:
        """The first of ``topics`` the broker says this principal may not WRITE (None: it
        may write them all, or the broker will not say)."""


class RealKafka:
    """:class:`KafkaClients` on the real cluster, bound to one client config (built once per
    pipeline, :meth:`of`; picklable, so Spark executors get it with their shard)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config: dict[str, Any] = dict(config)

    @classmethod
    def of(cls, kafka: Mapping[str, Any]) -> RealKafka:
        """The clients for a pipeline's ``kafka`` settings (:func:`librdkafka_config` of
        them)."""
        return cls(librdkafka_config(kafka))

    def _key(self) -> tuple[Any, ...]:
        # By each setting's repr: the logger librdkafka_config adds is a new object after
        # unpickling, with the same repr.
        return (type(self), tuple(sorted((k, repr(v)) for k, v in self.config.items())))

    def __eq__(self, other: object) -> bool:
        # Equal clients share idle producers (the pool's key) whichever object built them.
        return isinstance(other, RealKafka) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def partitions_of(self, topics: Sequence[str]) -> dict[str, list[int]]:
        """:func:`kafka.admin.partitions_of`."""
        from airflow_provider_eo.kafka import admin

        return admin.partitions_of(self.config, topics)

    def list_offsets(self, partitions: Iterable[TP], *, spec: str, timeout_s: float = 60.0) -> dict[TP, int]:
        """:func:`kafka.admin.list_offsets`."""
        from airflow_provider_eo.kafka import admin

        return admin.list_offsets(self.config, partitions, spec=spec, timeout_s=timeout_s)

    def offsets_for_timestamp(self, partitions: Iterable[TP], timestamp_ms: int) -> dict[TP, int]:
        """:func:`kafka.admin.offsets_for_timestamp`."""
        from airflow_provider_eo.kafka import admin

        return admin.offsets_for_timestamp(self.config, partitions, timestamp_ms)

    def committed_offsets(self, group: str, partitions: Iterable[TP]) -> dict[TP, int]:
        """:func:`kafka.admin.committed_group_offsets`."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_offsets(self.config, group, partitions)

    def tail_records(self, topic: str, *, per_partition: int) -> list[Any]:
        """:func:`kafka.tail.tail_records`."""
        from airflow_provider_eo.kafka.tail import tail_records

        return tail_records(dict(self.config), topic, per_partition=per_partition)

    def producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
        config: Mapping[str, Any] | None = None,
    ) -> Any:
        """:func:`kafka.publisher.new_producer`."""
        from airflow_provider_eo.kafka.publisher import new_producer

        settings = self.config if config is None else config
        return new_producer(
            settings, transactional_id, timeout_ms, on_failure, topic_max_bytes=topic_max_bytes
        )

    def committed_marks(
        self, group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks`."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks(self.config, group, partitions, stable=stable)

    def marks_elsewhere(self, group: str, sink_topic: str) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks_everywhere` but ``sink_topic``."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks_everywhere(self.config, group, exclude=[sink_topic])

    def group_metadata(self, group: str) -> Any:
        """:func:`kafka.publisher.group_metadata`."""
        from airflow_provider_eo.kafka.publisher import group_metadata

        return group_metadata(self.config, group)

    def last_published_checkpoint(self, topic: str, partition: int, pipeline_name: str, identity: str) -> int:
        """:func:`kafka.audit.last_published_checkpoint` (reads the partition's tail)."""
        from airflow_provider_eo.kafka import audit

        return audit.last_published_checkpoint(dict(self.config), topic, partition, pipeline_name, identity)

    def partition_count(self, topic: str) -> int:
        """:func:`kafka.admin.partition_count`."""
        from airflow_provider_eo.kafka import admin

        return admin.partition_count(self.config, topic)

    def topic_max_message_bytes(self, topic: str, default: int) -> int:
        """:func:`kafka.admin.topic_max_message_bytes`."""
        from airflow_provider_eo.kafka import admin

        return admin.topic_max_message_bytes(self.config, topic, default)

    def open_transactions(self, topic: str) -> dict[int, tuple[int, int]]:
        """Last stable offset vs high watermark of every partition, read_committed."""
        from airflow_provider_eo.kafka import admin

        stable, high = admin.sink_offsets(self.config, topic, admin.partition_count(self.config, topic))
        return {p: (stable[p], high[p]) for p in sorted(high) if stable.get(p, high[p]) < high[p]}

    def write_denied_topic(self, topics: Sequence[str]) -> str | None:
        """:func:`kafka.admin.write_denied_topic`."""
        from airflow_provider_eo.kafka import admin

        return admin.write_denied_topic(self.config, topics)


def kafka_clients(kafka: Mapping[str, Any], clients: KafkaClients | None = None) -> KafkaClients:
    """``clients`` when given (a caller's, built once for its pipeline; a test's fake), else
    :class:`RealKafka` for the ``kafka`` settings."""
    return clients if clients is not None else RealKafka.of(kafka)
