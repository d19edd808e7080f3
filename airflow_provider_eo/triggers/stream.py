"""Event trigger for an Airflow 3 ``AssetWatcher``: a streaming application running with
``commit="airflow"`` left a checkpoint PREPARED, so the commit DAG should run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_eo.triggers.checkpoint import check_ledger_ref, resolve_ledger_url
from airflow_provider_eo.version_compat import BaseEventTrigger, TriggerEvent


def read_prepared(ledger_url: str, pipeline: str) -> list[int]:
    """Ids of the pipeline's PREPARED checkpoints, lowest first; blocking, read-only. A
    pipeline the ledger does not know yet has none."""
    from airflow_provider_eo.core.stream import unfinished_checkpoints
    from airflow_provider_eo.ledger import CheckpointNotFound, CheckpointState, Ledger

    with Ledger(ledger_url, create=False) as ledger:
        try:
            unfinished = unfinished_checkpoints(ledger, pipeline)
        except CheckpointNotFound:
            return []
    return [cp.checkpoint_id for cp in unfinished if cp.state is CheckpointState.PREPARED]


class EoPreparedCheckpointTrigger(BaseEventTrigger):
    """Watch the ledger, read-only, and fire one event per checkpoint that became PREPARED.

    Meant for an ``AssetWatcher``: every event is an asset event, and the DAG scheduled on
    the asset commits the lowest PREPARED checkpoint (one run per event; the commit is
    idempotent, so a repeated event costs a run that finds nothing to do). The trigger
    runs for as long as the watcher exists and never writes.

    Events: ``{"status": "prepared", "pipeline", "checkpoint_id"}``. Within one run of the
    trigger each checkpoint fires once; after a triggerer restart the checkpoints still
    PREPARED fire again (their commit runs are no-ops once committed).

    :param pipeline: pipeline name (as recorded in the ledger).
    :param ledger_url: SQLAlchemy URL of the ledger, without a password.
    :param ledger_conn_id: or the Airflow connection of the ledger, looked up in the
        triggerer (exactly one of the two).
    :param poll_interval: seconds between reads.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        ledger_url: str | None = None,
        ledger_conn_id: str | None = None,
        poll_interval: float = 2.0,
    ) -> None:
        super().__init__()
        check_ledger_ref(ledger_url, ledger_conn_id, where=f"pipeline {pipeline!r}")
        self.pipeline = pipeline
        self.ledger_url = ledger_url
        self.ledger_conn_id = ledger_conn_id
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "ledger_url": self.ledger_url,
                "ledger_conn_id": self.ledger_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        fired: set[int] = set()
        url = await asyncio.to_thread(resolve_ledger_url, self.ledger_url, self.ledger_conn_id)
        while True:
            try:
                prepared = await asyncio.to_thread(read_prepared, url, self.pipeline)
            except LedgerError as exc:
                self.log.warning(
                    "pipeline %r: cannot read the ledger (%s); polling again", self.pipeline, exc
                )
                prepared = []
            for cid in prepared:
                if cid not in fired:
                    fired.add(cid)
                    yield TriggerEvent(
                        {"status": "prepared", "pipeline": self.pipeline, "checkpoint_id": cid}
                    )
            # Forget what is no longer PREPARED (committed or aborted): bounded memory.
            fired.intersection_update(prepared)
            await asyncio.sleep(self.poll_interval)
