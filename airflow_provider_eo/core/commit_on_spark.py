"""A spark-mode commit's driver side: the shards run as Spark tasks while this process
holds the commit lease (a thread renews it) and writes the ledger."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from airflow_provider_eo.core.commit_lease import lease_ttl, take_commit_lease
from airflow_provider_eo.core.shard import Publisher, ShardCommittable, ShardFailure, ShardRunner, ShardTask
from airflow_provider_eo.errors import CommitError, CommitLeaseLost, EoError
from airflow_provider_eo.ledger import CheckpointRecord, Ledger
from airflow_provider_eo.ledger.errors import LedgerUnavailable

# One logger name for every step of a commit.
log = logging.getLogger("airflow_provider_eo.core.commit")


class _LeaseKeeper(threading.Thread):
    """Renews the commit lease while a spark-mode commit's jobs run (the driver holds it for
    all of its shards; a commit on another host waits for it, as in local mode).

    A renewal the ledger does not answer (:class:`LedgerUnavailable`) is retried until the
    lease would lapse (:attr:`margin_s` before it, on this process's clock, counted from
    before the last renewal that succeeded). Then, or at once when the lease was taken over
    (an abort, another committer), the checkpoint's Spark jobs are cancelled, so no queued
    task of them begins after the lease, and :attr:`lost` says why. A task that begins all
    the same (this driver paused, a task already past Spark's scheduler) is refused by the
    abort mark an abort leaves (core/abort_marks.py); the keeper only keeps that rare.
    """

    #: The clock the lease's age is measured with (unit tests may replace it).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        ledger: Ledger,
        pipeline: str,
        checkpoint_id: int,
        owner: str,
        ttl_s: float,
        *,
        cancel: Callable[[], None],
    ) -> None:
        super().__init__(name=f"eo-commit-lease-{pipeline}-{checkpoint_id}", daemon=True)
        self.args = (ledger, pipeline, checkpoint_id, owner, ttl_s)
        self.cancel = cancel
        self.stop = threading.Event()
        self.margin_s = ttl_s / 6
        self.renewed = self.clock()  # the lease was taken right before the keeper starts
        #: Why the lease was given up (None while it is held).
        self.lost: str | None = None

    def run(self) -> None:
        ledger, pipeline, checkpoint_id, owner, ttl_s = self.args
        wait = ttl_s / 3
        while not self.stop.wait(wait):
            asked = self.clock()
            try:
                ledger.acquire_commit_lease(pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)
            except LedgerUnavailable as exc:
                left = self.renewed + ttl_s - self.clock()
                if left <= self.margin_s:
                    self._lose(
                        f"the ledger did not answer for {ttl_s - left:.0f} s, so the lease could "
                        f"not be renewed before it lapses (last error: {exc})"
                    )
                    return
                # Retry sooner, so a short outage does not cost the lease.
                wait = max(ttl_s / 60, min(ttl_s / 3, (left - self.margin_s) / 3))
                log.warning(
                    "pipeline %r, checkpoint %s: commit lease not renewed, retrying: %s",
                    pipeline,
                    checkpoint_id,
                    exc,
                )
                continue
            except EoError as exc:
                self._lose(f"the lease was taken over or the checkpoint moved on ({exc})")
                return
            self.renewed, wait = asked, ttl_s / 3

    def _lose(self, why: str) -> None:
        self.lost = why
        if self.stop.is_set():
            return  # the jobs are over: nothing to cancel
        try:
            self.cancel()
        except Exception as exc:  # the tasks are still refused by the abort marks
            log.warning("commit jobs not cancelled: %s", exc)


def _raise_shard_failure(c: ShardCommittable, outcome: ShardFailure | BaseException) -> None:
    """Re-raise a shard task's failure in the driver as the eo error it was, naming the
    pipeline, checkpoint and shard (and where it ran)."""
    from airflow_provider_eo import errors

    if isinstance(outcome, ShardFailure):
        cls = getattr(errors, outcome.error, None)
        if isinstance(cls, type) and issubclass(cls, EoError):
            try:
                error = cls(f"{outcome.message} (in the commit task on {outcome.host}, pid {outcome.pid})")
            except TypeError:  # a class that carries more than its message: named below instead
                pass
            else:
                raise error
        raise CommitError(
            f"{c.where}the commit task on {outcome.host} (pid {outcome.pid}) failed: "
            f"{outcome.error}: {outcome.message}. The checkpoint stays PREPARED; retry the commit "
            "(the shard's marker prevents duplicates)."
        )
    first = str(outcome).strip().splitlines()[0] if str(outcome).strip() else type(outcome).__name__
    raise CommitError(
        f"{c.where}the Spark job that commits this shard failed ({type(outcome).__name__}: "
        f"{first[:500]}). Nothing of an unfinished transaction is visible; the checkpoint stays "
        "PREPARED: retry the commit (the shard's marker prevents duplicates)."
    ) from outcome


def publish_on_spark(
    ledger: Ledger,
    cp: CheckpointRecord,
    committables: list[ShardCommittable],
    *,
    owner: str,
    runner: ShardRunner,
) -> list[Publisher]:
    """Run the shards as Spark tasks: all but the plan's last in parallel, then the last
    (the one that moves the pipeline's group) once every other shard is committed, so the
    group's offsets never pass output that is not committed. The ledger is written here, in
    the driver: the lease and every shard's PENDING row before any task starts, each shard's
    COMMITTED row as its outcome arrives."""
    name, cid = committables[0].pipeline, cp.checkpoint_id
    rows = {row.shard: row for row in ledger.get(name, cid).shards}
    ttl = lease_ttl(committables)
    taken = _LeaseKeeper.clock()  # the lease's age counts from before it was asked for
    take_commit_lease(ledger, name, cid, owner=owner, ttl_s=ttl)

    def row(c: ShardCommittable, state: str, records: int, publish_s: float | None = None) -> None:
        ledger.record_shard(
            name,
            cid,
            c.shard,
            transactional_id=c.transactional_id,
            producer_id=None,
            producer_epoch=None,
            state=state,
            records=records,
            publish_s=publish_s,
        )

    for c in committables:
        if c.shard not in rows or rows[c.shard].state.value != "COMMITTED":
            row(c, "PENDING", c.records)
    by_shard = {c.shard: c for c in committables}
    publishers: list[Publisher] = []

    def record(outcome: Publisher | ShardFailure) -> None:
        if isinstance(outcome, Publisher):
            c = by_shard[outcome.shard]
            row(c, "COMMITTED", c.records if outcome.skipped else outcome.records, outcome.publish_s)
            publishers.append(outcome)

    keeper = _LeaseKeeper(ledger, name, cid, owner, ttl, cancel=lambda: runner.cancel(name, cid))
    keeper.renewed = taken
    keeper.start()
    try:
        for phase in (committables[:-1], committables[-1:]):
            tasks = [ShardTask(c, row_before=c.shard in rows) for c in phase]
            outcomes = runner.run(tasks, record) if keeper.lost is None else []
            if keeper.lost is not None:
                done = sorted(p.shard for p in publishers)
                raise CommitLeaseLost(
                    f"pipeline {name!r}, checkpoint {cid}: this commit gave up its commit lease "
                    f"({keeper.lost}); its Spark jobs were cancelled, so no queued commit task "
                    f"begins. Shards committed: {done or 'none'} (their markers show it); "
                    "nothing of an unfinished shard is visible. Retry the commit once the ledger "
                    "answers (the markers prevent duplicates); if an abort took it over, its "
                    "range is replanned."
                )
            for shard, outcome in outcomes:
                if not isinstance(outcome, Publisher):
                    _raise_shard_failure(by_shard[shard], outcome)
    finally:
        keeper.stop.set()
    return publishers
