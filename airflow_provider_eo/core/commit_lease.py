"""The commit lease: taken before any shard is fenced, so live committers of one checkpoint
do not take turns fencing each other; taken over only from a process certainly gone."""

from __future__ import annotations

import logging

from airflow_provider_eo import names
from airflow_provider_eo.core.shard import ShardCommittable
from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.ledger.errors import CommitLeaseHeld
from airflow_provider_eo.processes import process_gone

# One logger name for every step of a commit.
log = logging.getLogger("airflow_provider_eo.core.commit")


def lease_ttl(committables: list[ShardCommittable]) -> float:
    """How long one take or renewal of the commit lease lasts: a shard's transaction is open at
    most its timeout; twice that and 30 s more, so a live committer never loses it."""
    return 2 * max(c.timeout_s for c in committables) + 30


def take_commit_lease(ledger: Ledger, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float) -> None:
    """Hold the commit lease of ``checkpoint_id`` for ``owner`` before any shard is fenced.

    Refused (:class:`CommitLeaseHeld`, naming the holder; nothing fenced or published) while
    another committer holds it live. Taken over at once only from a holder that is certainly
    gone: a committer process of this machine (same boot, same pid namespace) that no longer
    runs (:func:`airflow_provider_eo.processes.process_gone`; e.g. the killed try before an
    Airflow retry on the same host, a stream restarted after a crash). Anything else (another
    host, a paused process) keeps its lease until it runs out, or an explicit
    ``eo recover --force-live``. The take-over is recorded (the lease event's
    ``previous_owner``); the shard's fence then aborts whatever the dead one left open."""
    try:
        ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)
    except CommitLeaseHeld as held:
        process = names.lease_owner_process(held.owner or "")
        if process is None or not process_gone(process[1], process[2]):
            raise
        ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s, replacing=held.owner)
        log.warning(
            "pipeline %r, checkpoint %s: took the commit lease over from %r, whose process is gone",
            pipeline,
            checkpoint_id,
            held.owner,
        )
