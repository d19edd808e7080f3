"""The errors a shard's transaction ends with when a redo cannot help, with what was measured
and what to change: a transaction the broker aborted for its timeout, a record it refuses
every time."""

from __future__ import annotations

from confluent_kafka import KafkaException

from airflow_provider_eo.core.committable import ShardCommittable
from airflow_provider_eo.errors import CommitAccessDenied, CommitError, TransactionTimedOut
from airflow_provider_eo.kafka.acls import access_denied
from airflow_provider_eo.kafka.publisher import DeliveryFailures, largest_record


def kafka_words(exc: BaseException) -> str:
    """The Kafka error behind a sorted one, in the broker's and librdkafka's words (the sorted
    error's own explanation would guess at the cause)."""
    cause = exc.__cause__
    if isinstance(cause, KafkaException):
        err = cause.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def timed_out_error(
    c: ShardCommittable, seconds: float, sent: int, exc: BaseException
) -> TransactionTimedOut:
    """The error for a transaction the broker aborted for its timeout, with the measured
    publish time (``seconds`` open, ``sent`` records) and what to change."""
    progress = f"It had sent none of the shard's {c.records} records by then"
    if sent > 0 and seconds > 0:
        rate = sent / seconds
        progress = (
            f"It had sent {sent} of the shard's {c.records} records by then ({rate:,.1f} "
            f"records/s: all {c.records} take about {c.records / rate:,.1f} s)"
        )
    return TransactionTimedOut(
        f"{c.where}the transaction of {c.transactional_id!r} was open {seconds:.1f} s, as long "
        f"as its transaction.timeout.ms ({c.transaction_timeout_ms} ms) or longer, so the "
        f"broker aborted it ({kafka_words(exc)}). {progress}. Nothing of it is "
        "visible and the checkpoint stays PREPARED; a redo of the same size would time out "
        "again. Raise the pipeline's transaction_timeout_ms (up to the broker's "
        "transaction.max.timeout.ms, 15 minutes by default) and retry the commit, or abort "
        f"the checkpoint (`eo abort MODULE:ATTR {c.checkpoint_id} --reason TEXT`; refused "
        "once another shard of it has published) and lower max_records_per_checkpoint, so "
        "its range is replanned smaller. A pause of this process or a stalled broker counts "
        "toward the timeout too."
    )


def refused_record_error(c: ShardCommittable, failures: DeliveryFailures) -> CommitError:
    """The error for a record the broker refuses every time, naming the largest staged
    record of each refused partition (``failures``: the producer's delivery reports)."""
    message = failures.describe()
    if failures.denied_topic is not None:
        return access_denied(
            f"{c.where}publishing",
            "WRITE",
            "topic",
            failures.denied_topic,
            config=c.config,
            cause=f"{message}; the shard's transaction was aborted, nothing of it is visible",
            error=CommitAccessDenied,
        )
    for partition in sorted(failures.partitions & set(c.partitions)):
        found = largest_record(c.batches(partition))
        if found is not None:
            index, src, size = found
            message += (
                f"; the largest record of sink partition {partition} is record "
                f"{index} of its staged output (source {src}, {size} bytes of key+value)"
            )
    return CommitError(
        f"{c.where}{message}. The broker refuses this record every time, so "
        "the shard's transaction was aborted (nothing of it is visible) and the "
        "checkpoint stays PREPARED. A size refusal means the sink topic "
        f"{c.sink_topic!r} lowered max.message.bytes (or the broker its "
        "message.max.bytes) after prepare checked it: raise it above the record's "
        "size and retry the commit. An authorization refusal needs WRITE on the "
        "sink topic."
    )


def write_denied_error(c: ShardCommittable, topic: str, exc: BaseException) -> CommitError:
    """The error for a transaction that became abortable with no delivery report saying why,
    when the broker says this principal may not WRITE ``topic`` (librdkafka's
    AddPartitionsToTxn refused: the records were purged, never refused one by one)."""
    return access_denied(
        f"{c.where}publishing",
        "WRITE",
        "topic",
        topic,
        config=c.config,
        cause=f"{kafka_words(exc)}; the shard's transaction was aborted, nothing of it is visible",
        error=CommitAccessDenied,
    )
