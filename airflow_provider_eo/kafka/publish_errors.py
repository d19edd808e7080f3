"""A transactional producer's Kafka errors, sorted (the classes are listed in
:mod:`airflow_provider_eo.kafka.publisher`): retriable calls repeated, abortable ones
signalled, fenced/fatal/unauthorized ones raised as eo errors, failed delivery reports kept."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from airflow_provider_eo.errors import CommitError, CommitFenced, ControlSignal, TransactionalIdUnauthorized
from airflow_provider_eo.kafka.acls import is_authorization_error

T = TypeVar("T")


class Abortable(ControlSignal):
    """The open transaction must be aborted and the shard redone."""


class ProducerLost(ControlSignal):
    """An indefinite failure: this producer may not be used again; re-init and decide by marker."""


def _classify(err: KafkaError) -> str:
    if err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return "unauthorized"
    if err.fatal() or err.code() in (
        KafkaError._FATAL,  # produce() on a producer that already raised a fatal error
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ):
        return "fatal"
    if err.txn_requires_abort():
        return "abort"
    if err.retriable():
        return "retry"
    return "unknown"


# Delivery errors a redo cannot cure: the broker refuses these records every time.
_PERMANENT_DELIVERY = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
}


_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}

# Errors a producer's error_cb reports when a broker connection went away.
_CONNECTION_LOST = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}


class DeliveryFailures:
    """The producer's ``on_delivery`` callback: keeps the failed delivery reports of one
    producer (with ``delivery.report.only.error``, only failures are reported)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: KafkaError | None = None
        self.permanent_error: KafkaError | None = None
        self.denied_topic: str | None = None  # a topic the ACLs refused WRITE on
        self.partitions: set[int] = set()  # sink partitions with a failed record
        #: The producer lost a broker connection (its ``error_cb``): never reused after that.
        self.disconnected = False

    def connection_error(self, err: KafkaError) -> None:
        """The producer's ``error_cb`` (served by ``poll``/``flush``): a lost connection marks
        the producer as not to be kept. librdkafka's ``send_offsets_to_transaction`` can wait
        with no end for a group coordinator it cached before a broker restart (it checks no
        time-out on coordinator requests), so a producer that saw one is not used again."""
        if err.code() in _CONNECTION_LOST:
            self.disconnected = True

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        """Record one delivery report (called from ``poll``/``flush``)."""
        if err is None or err.code() in _PURGED:
            return  # purged by our own abort: a consequence, not a cause
        self.count += 1
        self.first = self.first or err
        if err.code() in _PERMANENT_DELIVERY and self.permanent_error is None:
            self.permanent_error = err
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self.denied_topic = str(msg.topic())
        self.partitions.add(int(msg.partition()))

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def permanent(self) -> bool:
        """A record was refused for a reason a redo cannot cure."""
        return self.permanent_error is not None

    def describe(self) -> str:
        """How many records failed, in which sink partitions, and why."""
        err = self.permanent_error or self.first
        if err is None:
            return "no delivery failed"
        where = ", ".join(str(p) for p in sorted(self.partitions))
        return (
            f"{self.count} record(s) of sink partition {where} failed delivery with "
            f"{err.name()} ({err.str()})"
        )


def known_commit_outcome(err: KafkaError) -> bool:
    """A failed ``commit_transaction`` whose error is an answer: fenced or fatal (another
    producer of the id took over, or the broker aborted the transaction), abortable (not
    committed: abort it), or unauthorized. A timeout (retriable) or an unclassified error
    leaves the outcome unknown."""
    return _classify(err) in ("fatal", "abort", "unauthorized")


def sorted_error(what: str, exc: KafkaException, where: str) -> Exception:
    """The exception for a non-retriable Kafka error (Abortable, fenced, ...)."""
    err: KafkaError = exc.args[0]
    kind = _classify(err)
    if kind == "abort":
        return Abortable(f"{what}: {err}")
    if kind == "unauthorized":
        return TransactionalIdUnauthorized(
            f"{where}{what} was refused: {err.name()} ({err.str()}). The broker's ACLs do "
            "not let this principal use the transactional id; grant WRITE and DESCRIBE on "
            "the transactional id (prefix) and retry. Nothing was published."
        )
    if kind == "fatal":
        return CommitFenced(
            f"{where}{what} failed fatally: {err.name()} ({err.str()}). Another committer "
            "with the same transactional id took over, or the producer was fenced after "
            "a pause past transaction.timeout.ms; this process stops. Its open "
            "transaction is aborted by the broker: no data from it becomes visible."
        )
    return CommitError(
        f"{where}{what} failed with an unclassified Kafka error {err.name()} "
        f"({err.str()}). The open transaction was not committed by this call; the retry "
        "decides by the commit marker, so no data is duplicated."
    )


def fatal_cause(exc: SystemError) -> KafkaException | None:
    """The Kafka error behind a ``SystemError`` from ``poll()``/``flush()``/``commit_transaction()``.

    A fatal error (the broker fenced the producer, e.g. after aborting its transaction for
    its timeout) is set as the pending exception while delivery reports are being served;
    confluent-kafka then still calls the ``on_delivery`` callback, whose first C call turns
    the pending error into a ``SystemError`` caused by it. ``None`` for any other
    ``SystemError`` (a real bug: never taken for a Kafka error).
    """
    cause = exc.__cause__
    return cause if isinstance(cause, KafkaException) else None


def serve(what: str, fn: Callable[..., T], *args: Any, where: str = "", in_transaction: bool = False) -> T:
    """``poll()`` or ``flush()``: serve delivery reports; a fatal error raised meanwhile is
    sorted like the Kafka error it is (:func:`fatal_cause`), never passed on raw.

    confluent-kafka sometimes loses the fatal error on the way (``SystemError: ... returned
    NULL without setting an exception``, seen when the broker fenced a producer mid-flush).
    With ``in_transaction`` (the producer has an open transaction), the producer is then
    asked with ``begin_transaction``: a fatal producer answers with its fatal error; a
    healthy one refuses it for its open transaction and nothing changes.
    """
    try:
        return fn(*args)
    except KafkaException as exc:
        raise sorted_error(what, exc, where) from exc
    except SystemError as exc:
        cause = fatal_cause(exc)
        if cause is None and in_transaction:
            cause = _fatal_state(getattr(fn, "__self__", None))
        if cause is None:
            raise
        raise sorted_error(what, cause, where) from cause


def _fatal_state(producer: Any) -> KafkaException | None:
    """The fatal error of ``producer`` (a transactional producer with an open transaction),
    or None when it has none."""
    if producer is None or not hasattr(producer, "begin_transaction"):
        return None
    try:
        producer.begin_transaction()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        return exc if isinstance(err, KafkaError) and err.fatal() else None
    except Exception:  # not a Kafka answer: nothing learned
        return None
    return None


def kafka_call(
    what: str,
    fn: Callable[..., T],
    *args: Any,
    deadline_s: float = 120.0,
    where: str = "",
    denied: Callable[[KafkaError], Exception] | None = None,
) -> T:
    """Call a transactional producer method, repeating it while Kafka says *retriable*.

    Raises :class:`Abortable`, :class:`CommitFenced`, :class:`ProducerLost` (retries ran out:
    the outcome is unknown) or :class:`CommitError` (unclassified); an ACL refusal raises
    ``denied(error)`` (naming the operation and the resource), never retried or aborted
    and redone.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            try:
                return fn(*args)
            except SystemError as exc:  # a fatal error met while serving delivery reports
                cause = fatal_cause(exc)
                if cause is None:
                    raise
                raise cause from None
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if denied is not None and is_authorization_error(err):
                raise denied(err) from exc
            if _classify(err) == "retry":
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise ProducerLost(f"{what} kept failing with a retriable error: {err}") from exc
            raise sorted_error(what, exc, where) from exc
