"""Trigger that waits, in the triggerer, until the ledger shows a checkpoint PREPARED."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_eo.version_compat import BaseTrigger, TriggerEvent

DONE_STATES = frozenset({"PREPARED", "COMMITTED"})
# The state read reports a checkpoint the ledger does not hold as this pseudo-state.
MISSING = "MISSING"


def read_checkpoint_state(ledger_url: str, pipeline: str, checkpoint_id: int) -> tuple[str, str | None]:
    """``(state, reason)`` of one checkpoint, read-only; blocking (the trigger runs it in a
    worker thread). ``state`` is the ledger's state name, or :data:`MISSING` when the
    ledger holds no such checkpoint; ``reason`` is the abort reason (or why it is missing).

    The one state read of the sensor's poke/pre-defer check and of the trigger.
    """
    from airflow_provider_eo.ledger import CheckpointNotFound, Ledger

    # create=False: no schema upgrade, no file creation; reads only.
    with Ledger(ledger_url, create=False) as ledger:
        try:
            cp = ledger.get(pipeline, checkpoint_id)
        except CheckpointNotFound as exc:
            return MISSING, str(exc)
    return cp.state.value, cp.abort_reason


class EoCheckpointTrigger(BaseTrigger):
    """Poll the ledger, read-only, until one checkpoint is PREPARED (or COMMITTED).

    It never writes: a trigger may run more than once (triggerer restarts, HA), so it
    only reads the checkpoint's state with ``asyncio.to_thread`` (the ledger client is
    synchronous) and yields exactly one event:

    - ``{"status": "success", "pipeline", "checkpoint_id", "state"}`` when PREPARED or
      COMMITTED;
    - ``{"status": "failed", "pipeline", "checkpoint_id", "state", "reason"}`` when
      ABORTED or when the checkpoint does not exist;
    - ``{"status": "timeout", "pipeline", "checkpoint_id", "state", "reason"}`` when
      ``deadline`` passed first.

    A ledger that cannot be reached is logged and polled again until the deadline.

    :param pipeline: pipeline name (as recorded in the ledger).
    :param checkpoint_id: the checkpoint to wait for.
    :param ledger_url: SQLAlchemy URL of the ledger (trigger kwargs are stored encrypted).
    :param poll_interval: seconds between reads.
    :param deadline: UNIX time after which a ``timeout`` event is sent; ``None`` waits forever.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int,
        ledger_url: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.checkpoint_id = int(checkpoint_id)
        self.ledger_url = ledger_url
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "checkpoint_id": self.checkpoint_id,
                "ledger_url": self.ledger_url,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    def _event(self, status: str, state: str, reason: str | None = None) -> TriggerEvent:
        payload: dict[str, Any] = {
            "status": status,
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id,
            "state": state,
        }
        if reason is not None:
            payload["reason"] = reason
        return TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_eo.ledger import LedgerError

        where = f"pipeline {self.pipeline!r}, checkpoint {self.checkpoint_id}"
        state = "UNKNOWN"
        while True:
            try:
                state, reason = await asyncio.to_thread(
                    read_checkpoint_state, self.ledger_url, self.pipeline, self.checkpoint_id
                )
            except LedgerError as exc:  # unreachable database: keep polling until the deadline
                self.log.warning("%s: cannot read the ledger (%s); polling again", where, exc)
            else:
                if state in DONE_STATES:
                    yield self._event("success", state)
                    return
                if state == "ABORTED":
                    yield self._event("failed", state, reason or f"{where} was ABORTED")
                    return
                if state == MISSING:
                    yield self._event("failed", state, reason or f"{where} is not in the ledger")
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                yield self._event(
                    "timeout", state, f"{where} still {state} at the deadline; is the prepare job running?"
                )
                return
            self.log.info("%s is %s; checking again in %.1fs", where, state, self.poll_interval)
            await asyncio.sleep(self.poll_interval)
