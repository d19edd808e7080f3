"""Wait on the ledger: a checkpoint PREPARED (or COMMITTED), or any checkpoint committed
after a time (streaming mode). Deferrable by default."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_eo.operators.base import PipelineTaskMixin
from airflow_provider_eo.triggers.checkpoint import (
    MISSING,
    EoCheckpointTrigger,
    EoCommittedAfterTrigger,
    as_utc,
    check_ledger_ref,
    done_states,
    read_checkpoint_state,
    read_committed_after,
)
from airflow_provider_eo.version_compat import (
    AirflowException,
    BaseSensorOperator,
    Context,
    PokeReturnValue,
    default_deferrable,
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
    """Wait until a checkpoint is PREPARED (or already COMMITTED) in the ledger; or, with
    ``wait_for="committed"``, until it is COMMITTED; or, with ``committed_after``, until
    any checkpoint of the pipeline was committed after that time (no ``checkpoint_id``:
    the streaming mode's "output at least this fresh").

    Deferrable by default: the wait runs in the triggerer (:class:`EoCheckpointTrigger`,
    read-only) and the worker slot is free meanwhile. With ``deferrable=False`` it pokes
    the ledger (``mode="poke"`` or ``"reschedule"``).

    Returns (XCom) ``{"status": "success", "pipeline", "checkpoint_id", "state"}`` (with
    ``committed_after``: ``{"status": "success", "pipeline", "checkpoint_id",
    "committed_at", "committed_after"}``, the newest committed checkpoint); raises
    :class:`CheckpointAborted` or :class:`CheckpointWaitTimeout` otherwise.

    :param pipeline: import path ``"module:ATTR"`` of the pipeline (for its name and
        ledger URL). (templated)
    :param checkpoint_id: the checkpoint to wait for, usually the plan's XCom; not given
        with ``committed_after``. (templated)
    :param wait_for: ``"prepared"`` (default: PREPARED or COMMITTED ends the wait) or
        ``"committed"`` (only COMMITTED).
    :param committed_after: wait instead for any checkpoint committed after this time: a
        datetime or an ISO-8601 string, e.g. ``"{{ data_interval_end }}"`` (naive means
        UTC). (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    :param deferrable: wait in the triggerer instead of poking; ``None`` (default): Airflow's
        ``[operators] default_deferrable``.
    :param check_before_defer: read the ledger once before deferring and return at once
        when the checkpoint is already PREPARED (saves a trip through the triggerer when
        the prepare job ran in client mode).
    """

    template_fields: Sequence[str] = ("pipeline", "checkpoint_id", "ledger_conn_id", "committed_after")
    ui_color = "#f0f7e8"

    def __init__(
        self,
        *,
        pipeline: str,
        checkpoint_id: int | str | None = None,
        ledger_conn_id: str | None = None,
        wait_for: str = "prepared",
        committed_after: dt.datetime | str | None = None,
        deferrable: bool | None = None,
        check_before_defer: bool = True,
        poke_interval: float = 5.0,
        timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self._set_pipeline_args(pipeline=pipeline, checkpoint_id=checkpoint_id, ledger_conn_id=ledger_conn_id)
        if (checkpoint_id is None) == (committed_after is None):
            raise ValueError(
                f"{kwargs.get('task_id')}: give checkpoint_id (wait for one checkpoint) or "
                "committed_after (wait for any checkpoint committed after a time), not both"
            )
        self.done = done_states(wait_for)  # ValueError for an unknown mode, at parse time
        self.wait_for = wait_for
        self.committed_after = committed_after
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.check_before_defer = check_before_defer

    def _after(self) -> dt.datetime | None:
        """The rendered ``committed_after`` as an aware UTC datetime (None: one checkpoint)."""
        if self.committed_after is None:
            return None
        try:
            return as_utc(self.committed_after)
        except (TypeError, ValueError) as exc:
            raise AirflowException(
                f"{self.task_id}: committed_after {self.committed_after!r} is not an ISO-8601 time"
            ) from exc

    def _fresh(self, name: str, url: str, after: dt.datetime) -> dict[str, Any] | None:
        found = read_committed_after(url, name, after)
        if found is None:
            return None
        cid, committed_at = found
        return {
            "status": "success",
            "pipeline": name,
            "checkpoint_id": cid,
            "committed_at": committed_at,
            "committed_after": after.isoformat(),
        }

    def _trigger_ledger(self, url: str) -> dict[str, Any]:
        """How the trigger names the ledger: the ledger connection read (the task's
        ``ledger_conn_id``, else the pipeline's; looked up in the triggerer, so the password
        never enters the trigger's stored kwargs), else the pipeline's URL, refused when it
        carries a password."""
        conn_id = self.ledger_connection_id()
        if conn_id:
            return {"ledger_url": None, "ledger_conn_id": str(conn_id)}
        check_ledger_ref(url, None, where=f"task {self.task_id!r}")
        return {"ledger_url": url, "ledger_conn_id": None}

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
        after = self._after()
        if after is not None:
            return self._defer_committed_after(after)
        name, cid, url = self._target()
        if self.check_before_defer:
            state, reason = read_checkpoint_state(url, name, cid)
            if state in self.done:
                self.log.info("pipeline %s: checkpoint %s is already %s", name, cid, state)
                return self._success(name, cid, state)
            self._raise_for(name, cid, state, reason)
        self.log.info("pipeline %s: deferring until checkpoint %s is %s", name, cid, self.wait_for.upper())
        self.defer(
            trigger=EoCheckpointTrigger(
                pipeline=name,
                checkpoint_id=cid,
                **self._trigger_ledger(url),
                poll_interval=self.poke_interval,
                deadline=time.time() + self.timeout,
                wait_for=self.wait_for,
            ),
            method_name="execute_complete",
            # A margin past the trigger's own deadline, so its typed timeout event wins.
            timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval + 60),
        )

    def _defer_committed_after(self, after: dt.datetime) -> Any:
        pipeline = self.resolve_pipeline()
        name, url = pipeline.name, pipeline.ledger_url
        if self.check_before_defer:
            fresh = self._fresh(name, url, after)
            if fresh is not None:
                self.log.info(
                    "pipeline %s: checkpoint %s committed at %s",
                    name,
                    fresh["checkpoint_id"],
                    fresh["committed_at"],
                )
                return fresh
        self.log.info(
            "pipeline %s: deferring until a checkpoint is committed after %s", name, after.isoformat()
        )
        self.defer(
            trigger=EoCommittedAfterTrigger(
                pipeline=name,
                committed_after=after.isoformat(),
                **self._trigger_ledger(url),
                poll_interval=self.poke_interval,
                deadline=time.time() + self.timeout,
            ),
            method_name="execute_complete",
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
        if "committed_after" in event:
            where = f"pipeline {event.get('pipeline')!r}"
            if status == "timeout":
                raise CheckpointWaitTimeout(f"{where}: {event.get('reason')}", event)
            raise CheckpointNotPrepared(f"{where}: unexpected trigger event {event!r}", event)
        where = f"pipeline {event.get('pipeline')!r}: checkpoint {event.get('checkpoint_id')}"
        if status == "failed":
            raise CheckpointAborted(f"{where}: {event.get('reason') or event.get('state')}", event)
        if status == "timeout":
            raise CheckpointWaitTimeout(
                f"{where}: not {self.wait_for.upper()} before the sensor timeout "
                f"({event.get('reason')}); a retry of the prepare (or commit) task resumes it",
                event,
            )
        raise CheckpointNotPrepared(f"{where}: unexpected trigger event {event!r}", event)

    def poke(self, context: Context) -> PokeReturnValue | bool:
        after = self._after()
        if after is not None:
            pipeline = self.resolve_pipeline()
            fresh = self._fresh(pipeline.name, pipeline.ledger_url, after)
            if fresh is not None:
                return PokeReturnValue(is_done=True, xcom_value=fresh)
            self.log.info("pipeline %s: nothing committed after %s yet", pipeline.name, after.isoformat())
            return False
        name, cid, url = self._target()
        state, reason = read_checkpoint_state(url, name, cid)
        if state in self.done:
            return PokeReturnValue(is_done=True, xcom_value=self._success(name, cid, state))
        self._raise_for(name, cid, state, reason)
        self.log.info("pipeline %s: checkpoint %s is %s", name, cid, state)
        return False
