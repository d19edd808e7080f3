"""Pipeline registration: the row every checkpoint hangs off, its settings fingerprint, and
its pinned transactional-id prefix."""

from __future__ import annotations

import uuid

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_provider_eo.errors import TransactionalIdPrefixMismatch as TransactionalIdPrefixMismatch
from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import LedgerError, PipelineFingerprintMismatch
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import pipeline_record
from airflow_provider_eo.ledger.models import Lineage, Pipeline
from airflow_provider_eo.ledger.reads import pipeline_row
from airflow_provider_eo.ledger.records import Actor, PipelineRecord


def pin_prefix(s: Session, pid: int, name: str, prefix: str) -> str:
    """Inside a write transaction: pin ``prefix`` for the pipeline unless one is pinned
    (one conditional UPDATE ``... WHERE transactional_id_prefix IS NULL``), then compare.

    Returns the pinned prefix; :class:`TransactionalIdPrefixMismatch` when it is another.
    """
    if not prefix:
        raise ValueError(f"pipeline '{name}': the transactional-id prefix must be non-empty")
    won = rowcount(
        s.execute(
            update(Pipeline)
            .where(Pipeline.id == pid, Pipeline.transactional_id_prefix.is_(None))
            .values(transactional_id_prefix=prefix)
            .execution_options(synchronize_session=False)
        )
    )
    pinned = s.execute(select(Pipeline.transactional_id_prefix).where(Pipeline.id == pid)).scalar_one()
    if won:
        add_event(s, pid, None, "prefix_pinned", details={"transactional_id_prefix": prefix})
    if pinned != prefix:
        raise TransactionalIdPrefixMismatch(
            f"pipeline '{name}' publishes under transactional_id_prefix {pinned!r} (pinned in "
            f"the ledger at its first checkpoint), but this process is configured with "
            f"{prefix!r}. Kafka fences an earlier committer only through the same "
            "transactional ids, so a committer with another prefix could publish the same "
            f"output twice: it was refused and nothing was produced. Restore the setting "
            f"transactional_id_prefix={pinned!r} for this pipeline (or use a new pipeline name "
            "for a new namespace).",
            pipeline=name,
            pinned=str(pinned),
            configured=prefix,
        )
    return prefix


def pin_transactional_id_prefix(db: Database, name: str, prefix: str) -> str:
    """Pin the pipeline's transactional-id prefix, or check ``prefix`` against it.

    One conditional UPDATE (``... WHERE transactional_id_prefix IS NULL``), then a
    compare: a process configured with another prefix gets
    :class:`~airflow_provider_eo.ledger.pipelines.TransactionalIdPrefixMismatch` (Kafka
    fences committers only within one transactional id). Idempotent; returns the prefix.
    """
    with db.write() as s:
        return pin_prefix(s, pipeline_row(s, db, name).id, name, prefix)


def ensure_pipeline(
    db: Database, name: str, fingerprint: str, *, allow_fingerprint_change: bool = False
) -> PipelineRecord:
    """Register the pipeline, or check that its settings' fingerprint did not change.

    Idempotent: calling it again with the same fingerprint changes nothing.
    """
    if not name:
        raise ValueError("pipeline name must be non-empty")
    for _ in range(2):  # a concurrent creator may win the unique name: then re-read
        try:
            with db.write() as s:
                row = s.execute(
                    select(Pipeline).where(Pipeline.name == name).with_for_update()
                ).scalar_one_or_none()
                now = utcnow()
                if row is None:
                    row = Pipeline(
                        name=name,
                        fingerprint=fingerprint,
                        created_at=now,
                        updated_at=now,
                        current_lineage=1,
                        last_checkpoint_id=0,
                        identity=uuid.uuid4().hex,
                    )
                    s.add(row)
                    s.flush()
                    s.add(
                        Lineage(
                            pipeline_id=row.id,
                            lineage=1,
                            started_at=now,
                            offsets=[],
                            reason="pipeline created",
                        )
                    )
                    add_event(
                        s,
                        row.id,
                        None,
                        "pipeline_created",
                        details={"fingerprint": fingerprint, "identity": row.identity},
                    )
                elif row.fingerprint != fingerprint:
                    if not allow_fingerprint_change:
                        raise PipelineFingerprintMismatch(
                            f"pipeline '{name}' was recorded with settings fingerprint "
                            f"{row.fingerprint} but its settings now hash to {fingerprint}: "
                            "the source topics, sink topic or transform changed under "
                            "existing checkpoints. Restore the old settings, or use a new "
                            "pipeline name, or accept the change explicitly with "
                            "allow_fingerprint_change=True (after a savepoint)."
                        )
                    add_event(
                        s,
                        row.id,
                        None,
                        "fingerprint_changed",
                        details={"old": row.fingerprint, "new": fingerprint},
                    )
                    row.fingerprint = fingerprint
                    row.updated_at = now
                return pipeline_record(row)
        except IntegrityError:
            continue
    raise LedgerError(f"could not register pipeline '{name}' (concurrent creation); retry")


# -- stop / resume (sp) ----------------------------------------------------------------------


def _fresh(s: Session, pid: int) -> Pipeline:
    # populate_existing: the conditional UPDATE bypassed the identity map.
    return s.execute(
        select(Pipeline).where(Pipeline.id == pid).execution_options(populate_existing=True)
    ).scalar_one()


def stop_pipeline(
    db: Database, name: str, *, stopped_by: str, reason: str, actor: Actor | None = None
) -> PipelineRecord:
    """Mark the pipeline stopped: plan refuses new checkpoints, an unfinished one still
    finishes. One conditional UPDATE (``... WHERE stopped_at IS NULL``) and a ``stop`` event.

    Idempotent: stopping a stopped pipeline changes nothing (the first stop's who/when/why
    stay) and returns its record.
    """
    with db.write() as s:
        p = pipeline_row(s, db, name)
        now = utcnow()
        won = rowcount(
            s.execute(
                update(Pipeline)
                .where(Pipeline.id == p.id, Pipeline.stopped_at.is_(None))
                .values(stopped_at=now, stopped_by=stopped_by, stop_reason=reason, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        )
        if won:
            add_event(
                s,
                p.id,
                None,
                "stop",
                actor=actor,
                at=now,
                details={"stopped_by": stopped_by, "reason": reason},
            )
        s.flush()
        return pipeline_record(_fresh(s, p.id))


def resume_pipeline(
    db: Database, name: str, *, resumed_by: str, actor: Actor | None = None
) -> PipelineRecord:
    """Clear the pipeline's stop: plan starts new checkpoints again. One conditional UPDATE
    (``... WHERE stopped_at IS NOT NULL``) and a ``resume`` event naming the stop it cleared.

    Idempotent: resuming a running pipeline changes nothing and returns its record.
    """
    with db.write() as s:
        p = pipeline_row(s, db, name)
        was = {
            "stopped_at": p.stopped_at.isoformat() if p.stopped_at else None,
            "stopped_by": p.stopped_by,
            "reason": p.stop_reason,
        }
        now = utcnow()
        won = rowcount(
            s.execute(
                update(Pipeline)
                .where(Pipeline.id == p.id, Pipeline.stopped_at.is_not(None))
                .values(stopped_at=None, stopped_by=None, stop_reason=None, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        )
        if won:
            add_event(
                s,
                p.id,
                None,
                "resume",
                actor=actor,
                at=now,
                details={"resumed_by": resumed_by, "cleared": was},
            )
        s.flush()
        return pipeline_record(_fresh(s, p.id))


def pin_staging_dir(db: Database, name: str, location: str, *, relative: bool) -> str:
    """The pipeline's staging location: pinned by its first prepare, then used by every
    process, whatever its working folder.

    ``location`` is this process's absolute resolution of the pipeline's ``staging_dir``;
    ``relative`` says it was configured relative (resolved against this working folder).
    Unpinned: pin ``location``. Pinned elsewhere: a relative setting takes the pinned
    location (it was resolved once, where the pipeline started); an absolute path or URI
    moves the pin (an event records it: checkpoints keep their own staging location).
    Returns the location to stage under.
    """
    with db.write() as s:
        row = pipeline_row(s, db, name, lock=True)
        if row.staging_dir == location:
            return location
        if row.staging_dir is not None and relative:
            return row.staging_dir
        add_event(
            s,
            row.id,
            None,
            "staging_pinned" if row.staging_dir is None else "staging_moved",
            details={"staging_dir": location, "previous": row.staging_dir},
        )
        row.staging_dir = location
        row.updated_at = utcnow()
        return location
