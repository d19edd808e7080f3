"""Pipeline registration: the row every checkpoint hangs off, and its settings fingerprint."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from airflow_provider_eo.ledger.engine import Database, utcnow
from airflow_provider_eo.ledger.errors import LedgerError, PipelineFingerprintMismatch
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import pipeline_record
from airflow_provider_eo.ledger.models import Lineage, Pipeline
from airflow_provider_eo.ledger.records import PipelineRecord


def ensure_pipeline(
    db: Database, name: str, fingerprint: str, *, allow_fingerprint_change: bool = False
) -> PipelineRecord:
    """Register the pipeline (with lineage 1), or check its fingerprint; see Ledger."""
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
