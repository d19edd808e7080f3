"""The checkpoint ledger's front: :class:`Ledger`, the one place that decides what a
pipeline has read and published.

Each method is the function of the module that owns the concept, bound to the ledger's
database (:func:`_delegate`: its signature and contract are written once, there):

=====================  ==================================================================
``engine``             connection settings, SQLite pragmas, session scopes, the clock
``schema``             Alembic revisions, upgrade/downgrade, the check made on open
``pipelines``          registration and the settings fingerprint
``reads``              row lookups and read-only queries
``transitions``        plan, prepare, commit, abort: each one conditional UPDATE
``leases``             the commit lease, the commit shard rows, the fence lease and the
                       abort it guards (refused while a committer holds a live lease)
``lineage``            partition heads and restore (a recorded lineage break)
``savepoints``         named, retained offsets
``backfill``           a time interval's committed ranges, backfill coverage and plan
``events``             the append-only event log
``mapping``            row -> record
=====================  ==================================================================
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine

from airflow_provider_eo.ledger import (
    backfill,
    dashboard,
    events,
    leases,
    lineage,
    pipelines,
    reads,
    savepoints,
    schema,
    streams,
    transitions,
    watches,
)
from airflow_provider_eo.ledger.engine import Database
from airflow_provider_eo.ledger.states import ShardState

P = ParamSpec("P")
R = TypeVar("R")


def _delegate(fn: Callable[Concatenate[Database, P], R]) -> Callable[Concatenate[Ledger, P], R]:
    """A :class:`Ledger` method calling ``fn`` with the ledger's database; ``fn``'s
    signature, types and docstring are the method's."""

    @functools.wraps(fn)
    def method(self: Ledger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return fn(self._db, *args, **kwargs)

    # help() and inspect show the method's own parameters: ``self`` where ``fn`` has ``db``.
    signature = inspect.signature(fn)
    first, *rest = signature.parameters.values()
    this = first.replace(name="self", annotation="Ledger")
    method.__signature__ = signature.replace(parameters=[this, *rest])  # type: ignore[attr-defined]
    return method


class Ledger:
    """The checkpoint ledger on a SQL database.

    :param url: SQLAlchemy URL: ``sqlite:///path/ledger.db`` (embedded) or
        ``postgresql+psycopg://user:pw@host:5432/db`` (production).
    :param create: SQLite: create the file and upgrade the schema to head. Other
        databases: create the schema when the database has none, and refuse to run
        on an older schema (run ``eo ledger upgrade`` explicitly for those).
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._db = Database(url)
        #: The URL with its password masked: safe to print and log.
        self.url = self._db.url
        if create:
            schema.prepare_schema(self._db)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._db.engine

    @property
    def dialect(self) -> str:
        return self._db.dialect

    def close(self) -> None:
        """Close pooled connections (the ledger stays usable; connections reopen lazily)."""
        self._db.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------------------

    def head_revision(self) -> str:
        """The schema revision this package needs."""
        return schema.head_revision()

    current_revision = _delegate(schema.current_revision)
    upgrade = _delegate(schema.upgrade)
    downgrade = _delegate(schema.downgrade)

    # -- pipelines -------------------------------------------------------------------------

    ensure_pipeline = _delegate(pipelines.ensure_pipeline)
    pin_transactional_id_prefix = _delegate(pipelines.pin_transactional_id_prefix)
    pin_staging_dir = _delegate(pipelines.pin_staging_dir)
    get_pipeline = _delegate(reads.get_pipeline)
    list_pipelines = _delegate(reads.list_pipelines)

    # -- reading checkpoints -----------------------------------------------------------------

    unfinished = _delegate(reads.unfinished)
    unfinished_checkpoints = _delegate(reads.unfinished_checkpoints)
    last_committed = _delegate(reads.last_committed)
    get = _delegate(reads.get)
    list_checkpoints = _delegate(reads.list_checkpoints)
    next_starts = _delegate(reads.next_starts)
    record_event = _delegate(events.record_event)
    events = _delegate(events.list_events)

    # -- the Airflow UI's page (read-only, index-bounded) ------------------------------------

    pipeline_names = _delegate(dashboard.pipeline_names)
    pipeline_overview = _delegate(dashboard.pipeline_overview)
    checkpoint_page = _delegate(dashboard.checkpoint_page)
    committed_ends = _delegate(dashboard.committed_ends)

    # -- transitions -----------------------------------------------------------------------

    plan = _delegate(transitions.plan)
    freeze_commit_plan = _delegate(transitions.freeze_commit_plan)
    mark_prepared = _delegate(transitions.mark_prepared)
    mark_committed = _delegate(transitions.mark_committed)
    abort = _delegate(leases.abort)

    # -- commit lease and shards -------------------------------------------------------------

    acquire_commit_lease = _delegate(leases.acquire_commit_lease)
    release_commit_lease = _delegate(leases.release_commit_lease)

    # -- fence lease: an abort or a recovery holds every unfinished checkpoint ---------------

    acquire_fence_lease = _delegate(leases.acquire_fence_lease)
    renew_fence_lease = _delegate(leases.renew_fence_lease)
    release_fence_lease = _delegate(leases.release_fence_lease)

    def record_shard(
        self,
        pipeline: str,
        checkpoint_id: int,
        shard: int,
        *,
        transactional_id: str,
        producer_id: int | None,
        producer_epoch: int | None,
        state: ShardState | str,
        records: int,
        publish_s: float | None = None,
    ) -> None:
        """Upsert one commit shard's progress. A COMMITTED shard never goes back to PENDING
        (InvariantViolation); recording the same thing twice is a no-op. ``state`` is a
        :class:`ShardState` or its value (ValueError for anything else). ``publish_s``, with
        COMMITTED: the seconds the transaction that published it took (a ``publish`` event)."""
        leases.record_shard(
            self._db,
            pipeline,
            checkpoint_id,
            shard,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            state=ShardState(state),
            records=records,
            publish_s=publish_s,
        )

    # -- savepoints and restore --------------------------------------------------------------

    create_savepoint = _delegate(savepoints.create_savepoint)
    get_savepoint = _delegate(savepoints.get_savepoint)
    list_savepoints = _delegate(savepoints.list_savepoints)
    restore = _delegate(lineage.restore)

    # -- savepoints at a checkpoint, stop/resume, guarded restore ------------------------------

    savepoint_at_checkpoint = _delegate(savepoints.savepoint_at_checkpoint)
    delete_savepoint = _delegate(savepoints.delete_savepoint)
    stop_pipeline = _delegate(pipelines.stop_pipeline)
    resume_pipeline = _delegate(pipelines.resume_pipeline)
    restore_once = _delegate(lineage.restore_once)
    find_restore = _delegate(lineage.find_restore)

    # -- backfill: a time interval of committed ranges, re-processed once per target ---------

    committed_ranges_in = _delegate(backfill.committed_ranges_in)
    backfill_work = _delegate(backfill.backfill_work)
    register_backfill_pipeline = _delegate(backfill.register_backfill_pipeline)
    plan_backfill = _delegate(backfill.plan_backfill_checkpoint)

    # -- stream runs: who runs the streaming application, heartbeat, stop request ------------

    register_stream_run = _delegate(streams.register_stream_run)
    heartbeat_stream_run = _delegate(streams.heartbeat_stream_run)
    end_stream_run = _delegate(streams.end_stream_run)
    request_stream_stop = _delegate(streams.request_stream_stop)
    get_stream_run = _delegate(streams.get_stream_run)
    live_stream_run = _delegate(streams.live_stream_run)

    # -- asset watchers: what each last fired for, and what they read -----------------------

    get_watch_mark = _delegate(watches.get_watch_mark)
    claim_watch_mark = _delegate(watches.claim_watch_mark)
    checkpoints_after = _delegate(watches.checkpoints_after)
    newest_checkpoint_id = _delegate(watches.newest_checkpoint_id)
    stream_committers = _delegate(watches.stream_committers)

    # -- lead: recover ------------------------------------------------------------------------
    transactional_ids = _delegate(reads.transactional_ids)
