"""The transactional publisher of one commit shard, with Kafka errors sorted.

Error classes (docs/design.md §3a):

1. ``retriable()``: repeat the same call (``send_offsets_to_transaction`` with identical
   offsets: retriable but not resumable).
2. ``txn_requires_abort()``: abort the transaction and redo the whole shard. A failed
   delivery report puts the transaction in this state too: the next ``produce()`` raises
   ``_STATE`` and the commit step says ``txn_requires_abort``; the failed reports are kept
   (:class:`DeliveryFailures`) so a record the broker will always refuse (too large for
   the sink topic) stops the shard with an error naming it, instead of a redo loop.
3. fatal / fenced: destroy the producer and fail with the reason.
4. anything else: fail loudly, saying whether data may be affected.

A producer is never reused across an error of any kind: librdkafka lacks KIP-890's
per-transaction epoch bump, so a request of a failed transaction could land in the next one
(KAFKA-17754); after any failure a fresh producer and ``init_transactions`` follow. Only a
producer whose last transaction committed cleanly (every record and the end of the
transaction acknowledged, nothing in flight) is kept, idle, for the same transactional id's
next transaction in the same process (:class:`ProducerPool`): the first use of an id in a
process still creates the producer and calls ``init_transactions``.

In three modules, re-exported here: :mod:`.publish_errors` (the sorting above, failed
delivery reports), :mod:`.producer_pool` (the producers and their pool), :mod:`.produce`
(the produce loop); the ``eo.prov`` header is built by :mod:`airflow_provider_eo.provenance`.
"""

from __future__ import annotations

from airflow_provider_eo.kafka.produce import (
    HEADER_FRAMING_BYTES,
    RECORD_BATCH_FRAMING_BYTES,
    Sent,
    connect,
    dead_letter_headers,
    group_metadata,
    largest_record,
    offsets,
    produce,
    produce_dead_letters,
    produce_staged,
    record_batch_size,
    with_dead_letter_limits,
)
from airflow_provider_eo.kafka.producer_pool import (
    BATCH_FRAMING_BYTES,
    LIBRDKAFKA_BATCH_SIZE,
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
    PRODUCERS,
    PooledProducer,
    ProducerPool,
    close_producers,
    new_producer,
)
from airflow_provider_eo.kafka.publish_errors import (
    Abortable,
    DeliveryFailures,
    ProducerLost,
    fatal_cause,
    kafka_call,
    known_commit_outcome,
    serve,
    sorted_error,
)
from airflow_provider_eo.provenance import compact_provenance_values, provenance_values

__all__ = [
    "BATCH_FRAMING_BYTES",
    "HEADER_FRAMING_BYTES",
    "LIBRDKAFKA_BATCH_SIZE",
    "LIBRDKAFKA_MESSAGE_MAX_BYTES",
    "PRODUCERS",
    "RECORD_BATCH_FRAMING_BYTES",
    "Abortable",
    "DeliveryFailures",
    "PooledProducer",
    "ProducerLost",
    "ProducerPool",
    "Sent",
    "close_producers",
    "compact_provenance_values",
    "connect",
    "dead_letter_headers",
    "fatal_cause",
    "group_metadata",
    "kafka_call",
    "known_commit_outcome",
    "largest_record",
    "new_producer",
    "offsets",
    "produce",
    "produce_dead_letters",
    "produce_staged",
    "provenance_values",
    "record_batch_size",
    "serve",
    "sorted_error",
    "with_dead_letter_limits",
]
