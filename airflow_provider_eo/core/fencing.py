"""Fencing a pipeline's transactional ids without killing a live committer.

A pipeline's transactional ids are one per commit shard (``{prefix}.{pipeline}.{shard}``),
shared by all its checkpoints: that is what lets a commit retry fence every zombie of the
pipeline and keeps the commit markers monotonic (docs/design.md §2, abort). So
``init_transactions`` on one of them for checkpoint N+1 aborts the open transaction of the
committer of checkpoint N as well. An abort or ``eo recover`` therefore fences only under a
:class:`FenceLease`:

1. Taken before the first fence: the commit lease of every unfinished checkpoint of the
   pipeline, for this fencer. Refused while a committer holds a live lease on any of them
   ("checkpoint N is being committed by OWNER until T; wait, or stop it first"); while held,
   no committer passes its lease check, so none begins a transaction meanwhile. A committer
   that died holds its lease until T; only when it is known to be dead may the fencer take
   that lease at once (``take_over``: ``--force-live`` of ``eo abort`` and ``eo recover``),
   since a live committer would be fenced mid-commit.
2. Renewed before each id is fenced and by a heartbeat thread while one
   ``init_transactions`` takes long (never a fixed time: one fence may take up to the
   transaction timeout per id). A renewal finds out when a committer took the lease over
   (this process stalled past it) and the fencer stops.
3. Released at the end, so committers go on at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.errors import AbortRefused, EoError
from airflow_provider_eo.kafka.acls import commit_denied
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.publisher import PRODUCERS, ProducerLost, connect, kafka_call
from airflow_provider_eo.ledger import Actor, Ledger, LedgerError
from airflow_provider_eo.ledger.leases import CommitInProgress
from airflow_provider_eo.pipeline import Pipeline

log = logging.getLogger(__name__)

#: How long one renewal of a fence lease lasts; the heartbeat renews it every third of that.
FENCE_LEASE_S = 30.0


def fence_owner(actor: Actor | None) -> str:
    """The lease owner of an abort or a recovery run by ``actor`` (this process when None):
    never a committer's owner, so a committer's lease is seen as held by someone else, and one
    process's recovery and the abort it may call share it."""
    return f"fence:{(actor or Actor.here()).label() or 'unknown'}"


class FenceLease:
    """The fence lease of one abort or recovery (see the module docstring), as a context
    manager: entering takes it (raises
    :class:`~airflow_provider_eo.ledger.leases.CommitInProgress` while a committer holds a
    live lease), a heartbeat thread renews it until the block ends, leaving releases it.

    :param take_over: take live commit leases too (a committer known to be dead).
    """

    def __init__(
        self,
        ledger: Ledger,
        pipeline: str,
        *,
        owner: str,
        ttl_s: float = FENCE_LEASE_S,
        take_over: bool = False,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ledger = ledger
        self.pipeline = pipeline
        self.owner = owner
        self.ttl_s = ttl_s
        self.take_over = take_over
        #: The checkpoints held at the last take or renewal, lowest first.
        self.held: list[int] = []
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> FenceLease:
        self.held = self.ledger.acquire_fence_lease(
            self.pipeline, owner=self.owner, ttl_s=self.ttl_s, take_over=self.take_over
        )
        self._beat = threading.Thread(target=self._heartbeat, name="eo-fence-lease", daemon=True)
        self._beat.start()
        return self

    def renew(self) -> None:
        """Hold every unfinished checkpoint for another ``ttl_s``; raises
        :class:`~airflow_provider_eo.ledger.leases.CommitInProgress` once a committer took the
        lease over (the caller must stop: that committer may have begun a transaction)."""
        self.held = self.ledger.renew_fence_lease(self.pipeline, owner=self.owner, ttl_s=self.ttl_s)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except CommitInProgress:  # taken over: the caller's next renewal stops it
                return
            except LedgerError as exc:  # the ledger did not answer: try again at the next beat
                log.warning("pipeline %r: fence lease not renewed: %s", self.pipeline, exc)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            self.ledger.release_fence_lease(self.pipeline, owner=self.owner)
        except LedgerError as error:  # it runs out by itself within ttl_s
            log.warning("pipeline %r: fence lease not released: %s", self.pipeline, error)


def fence(
    pipeline: Pipeline,
    transactional_ids: list[str],
    *,
    lease: FenceLease,
    where: str,
    refused: type[EoError] = AbortRefused,
    then: str = "Retry the abort once the broker answers.",
    clients: KafkaClients | None = None,
) -> None:
    """``init_transactions`` with a fresh producer per id, each right after renewing
    ``lease``: bumps each id's epoch, so the broker aborts any open transaction of an earlier
    producer and fences it.

    :param refused: the error raised when an id cannot be fenced (``then`` ends its message).
    """
    clients = kafka_clients(pipeline.kafka, clients)
    config = librdkafka_config(pipeline.kafka)
    for txn_id in transactional_ids:
        lease.renew()
        try:
            fence_id(
                txn_id,
                config=config,
                sink_topic=pipeline.sink_topic,
                transaction_timeout_ms=pipeline.transaction_timeout_ms,
                where=where,
                clients=clients,
            )
        except ProducerLost as exc:
            raise refused(
                f"{where}could not fence transactional id {txn_id!r} ({exc}); nothing was "
                f"aborted and the checkpoint is unchanged. {then}"
            ) from exc


__all__ = ["FENCE_LEASE_S", "FenceLease", "fence", "fence_owner"]


def fence_id(
    transactional_id: str,
    *,
    config: Mapping[str, Any],
    sink_topic: str,
    transaction_timeout_ms: int,
    where: str,
    clients: KafkaClients,
) -> None:
    """``init_transactions`` with a fresh producer on ``transactional_id``: bumps its epoch,
    so the broker aborts any open transaction of an earlier producer and fences it. Raises
    :class:`ProducerLost` when the broker did not answer (the caller says what to do)."""
    timeout_s = transaction_timeout_ms / 1000
    # An idle producer this process kept for the id is fenced by this: close it now.
    PRODUCERS.discard(lambda key: isinstance(key, tuple) and key[0] == clients and key[2] == transactional_id)
    producer = clients.producer(transactional_id, transaction_timeout_ms, None, None)
    try:
        kafka_call("metadata", connect, producer, sink_topic, timeout_s, where=where)
        kafka_call(
            "init_transactions",
            producer.init_transactions,
            timeout_s,
            where=where,
            denied=lambda err: commit_denied(
                err, f"{where}fencing {transactional_id}", transactional_id=transactional_id, config=config
            ),
        )
    finally:
        del producer
