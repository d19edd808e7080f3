"""Exactly-once Kafka output for an existing Spark Structured Streaming query.

``KafkaExactlyOnceSink`` wires a query's ``foreachBatch`` to the provider's checkpoint
ledger and two-phase commit: each micro-batch is a checkpoint whose output is staged, then
published in Kafka transactions with the consumer group's offsets. Spark's own state store
keeps the query's state. See :mod:`airflow_provider_eo.streaming.sink`.
"""

from __future__ import annotations

from airflow_provider_eo.streaming.sink import KafkaExactlyOnceSink

__all__ = ["KafkaExactlyOnceSink"]
