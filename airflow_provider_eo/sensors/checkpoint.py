"""Wait until the ledger shows a checkpoint PREPARED: deferrable by default."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_eo.operators.base import PipelineTaskMixin
from airflow_provider_eo.triggers.checkpoint import (
    DONE_STATES,
    MISSING,
    EoCheckpointTrigger,
    read_checkpoint_state,
)
from airflow_provider_eo.version_compat import (
    AirflowException,
    BaseSensorOperator,
    Context,
    PokeReturnValue,
)


class CheckpointNotPrepared(AirflowException):
    """The checkpoint did not become PREPARED. ``event`` holds the trigger's payload."""

    def __init__(self, message: str, event: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.event = event or {}


class CheckpointAborted(CheckpointNotPrepared):
    """The checkpoint was ABORTED (or is not in the ledger); the next run replans its range."""


class CheckpointWaitTimeout(CheckpointNotPrepared):
    """The sensor's timeout passed while the checkpoint was still PLANNED."""


class EoCheckpointSensor(PipelineTaskMixin, BaseSensorOperator):
    """Wait until a checkpoint is PREPARED (or already COMMITTED) in the ledger.

    Deferrable by default: the wait runs in the triggerer (:class:`EoCheckpointTrigger`,
    read-only) and the worker slot is free meanwhile. With ``deferrable=False`` it pokes
    the ledger (``mode="poke"`` or ``"reschedule"``).

    Returns (XCom) ``{"status": "success", "pipeline", "checkpoint_id", "state"}``; raises
    :class:`CheckpointAborted` or :class:`CheckpointWaitTimeout` otherwise.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline (for its name and
        ledger URL). (templated)
    :param checkpoint_id: the checkpoint to wait for, usually the plan's XCom. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param deferrable: wait in the triggerer (default) instead of poking.
    :param check_before_defer: read the ledger once before deferring and return at once
        when the checkpoint is already PREPARED (saves a trip through the triggerer when
        the prepare job ran in client mode).
    """

    template_fields: Sequence[str] = ("pipeline", "checkpoint_id", "ledger_conn_id")
    ui_color = "#f0f7e8"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str,
        ledger_conn_id: str | None = None,
        deferrable: bool = True,
        check_before_defer: bool = True,
        poke_interval: float = 5.0,
        timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self._set_pipeline_args(pipeline=pipeline, checkpoint_id=checkpoint_id, ledger_conn_id=ledger_conn_id)
        self.deferrable = deferrable
        self.check_before_defer = check_before_defer

    def _target(self) -> tuple[str, int, str]:
        cid = self.target_checkpoint()
        pipeline = self.resolve_pipeline()
        return pipeline.name, cid, pipeline.ledger_url

    @staticmethod
    def _success(name: str, cid: int, state: str) -> dict[str, Any]:
        return {"status": "success", "pipeline": name, "checkpoint_id": cid, "state": state}

    def _raise_for(self, name: str, cid: int, state: str, reason: str | None) -> None:
        event = {"status": "failed", "pipeline": name, "checkpoint_id": cid, "state": state}
        if state in ("ABORTED", MISSING):
            raise CheckpointAborted(
                f"pipeline {name!r}: checkpoint {cid} is {state}"
                f"{f' ({reason})' if reason else ''}; nothing will be committed from it, the "
                "next DAG run replans its range",
                {**event, "reason": reason},
            )

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        name, cid, url = self._target()
        if self.check_before_defer:
            state, reason = read_checkpoint_state(url, name, cid)
            if state in DONE_STATES:
                self.log.info("pipeline %s: checkpoint %s is already %s", name, cid, state)
                return self._success(name, cid, state)
            self._raise_for(name, cid, state, reason)
        self.log.info("pipeline %s: deferring until checkpoint %s is PREPARED", name, cid)
        self.defer(
            trigger=EoCheckpointTrigger(
                pipeline=name,
                checkpoint_id=cid,
                ledger_url=url,
                poll_interval=self.poke_interval,
                deadline=time.time() + self.timeout,
            ),
            method_name="execute_complete",
            # A margin past the trigger's own deadline, so its typed timeout event wins.
            timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval + 60),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger: return the success event, raise a typed error otherwise."""
        event = event or {}
        status = event.get("status")
        if status == "success":
            self.log.info(
                "pipeline %s: checkpoint %s is %s",
                event.get("pipeline"),
                event.get("checkpoint_id"),
                event.get("state"),
            )
            return event
        where = f"pipeline {event.get('pipeline')!r}: checkpoint {event.get('checkpoint_id')}"
        if status == "failed":
            raise CheckpointAborted(f"{where}: {event.get('reason') or event.get('state')}", event)
        if status == "timeout":
            raise CheckpointWaitTimeout(
                f"{where}: not PREPARED before the sensor timeout ({event.get('reason')}); a retry "
                "of the prepare task resumes it",
                event,
            )
        raise CheckpointNotPrepared(f"{where}: unexpected trigger event {event!r}", event)

    def poke(self, context: Context) -> PokeReturnValue | bool:
        name, cid, url = self._target()
        state, reason = read_checkpoint_state(url, name, cid)
        if state in DONE_STATES:
            return PokeReturnValue(is_done=True, xcom_value=self._success(name, cid, state))
        self._raise_for(name, cid, state, reason)
        self.log.info("pipeline %s: checkpoint %s is %s", name, cid, state)
        return False
