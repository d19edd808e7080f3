"""Take a named savepoint of a pipeline from Airflow (optionally stopping it first)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.ledger import CheckpointNotFound, SavepointNotFound
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.version_compat import AirflowFailException, BaseOperator, Context, default_deferrable

#: What a savepoint name may look like (the savepoint DAG's form refuses anything else):
#: a letter or digit first, then letters, digits, ``.``, ``_`` and ``-``, at most 128.
SAVEPOINT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", "", "none"})


def parse_bool(value: Any, *, field: str) -> bool:
    """A (possibly rendered) boolean: ``True``/``"true"``/``"1"`` ... or ``False``/``"false"``/``""``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{field} must be a boolean (true/false), got {value!r}")


def parse_seconds(value: Any, *, field: str) -> float:
    """A (possibly rendered) non-negative number of seconds."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field} must be a number of seconds, got {value!r}") from None
    if seconds < 0:
        raise ValueError(f"{field} must be >= 0, got {value!r}")
    return seconds


def created_by_for(context: Context | dict[str, Any]) -> str:
    """Who took the savepoint, as the ledger records it: ``airflow:<dag_id>/<run_id>`` and,
    when the run was triggered by a user (Airflow 3.1+ records it on the DAG run; the
    UI's Trigger form, ``airflow dags trigger`` and the REST API all set it), `` by <user>``."""
    ti = context["ti"]
    text = f"airflow:{ti.dag_id}/{ti.run_id}"
    dag_run = context.get("dag_run")
    user = getattr(dag_run, "triggering_user_name", None) if dag_run is not None else None
    return f"{text} by {user}" if user else text


class EoSavepointOperator(PipelineTaskMixin, BaseOperator):
    """Take a named savepoint of a pipeline: the end offsets of its newest COMMITTED
    checkpoint, or of the checkpoint in flight when the task starts, once it commits (right
    after a restore or reset, before anything committed since: the offsets it started from,
    with no ``checkpoint_id``).

    Calls :func:`airflow_provider_eo.core.savepoint.take_savepoint`. With ``stop=True``
    the pipeline is marked stopped first, so its DAG's next runs skip while the in-flight
    checkpoint is allowed to finish (``eo resume MODULE:ATTR`` clears the stop).

    **Waiting.** The savepoint waits (at most ``wait_seconds``) until nothing that was in
    flight when the task started is unfinished. With ``deferrable`` (by default Airflow's
    ``[operators] default_deferrable``) the task records the stop, then defers to
    :class:`~airflow_provider_eo.triggers.checkpoint.EoCheckpointTrigger` for each such
    checkpoint (the triggerer reads the ledger; the task holds no worker slot) and records the
    savepoint when it resumes: the trigger only reads, the task writes. Without it the task
    polls the ledger every ``poll_seconds`` from its slot. Past ``wait_seconds`` the task
    fails (a retry waits again; a stop stays in place and the error says so).

    Idempotent on retry: if this DAG run already recorded the savepoint (a try that died
    after the ledger write), the retry returns it instead of failing on the duplicate name.

    Returns (XCom) :meth:`SavepointRecord.summary` (``pipeline``, ``name``,
    ``checkpoint_id``, ``offsets``, ``note``, ``created_by``, ``created_at``, ...).

    :param pipeline: import path ``"module:ATTR"`` of the pipeline. (templated)
    :param savepoint_name: the savepoint's name, unique per pipeline; must match
        :data:`SAVEPOINT_NAME_PATTERN`. (templated)
    :param note: free text recorded with the savepoint. (templated)
    :param stop: mark the pipeline stopped before taking the savepoint (a bool, or a
        template rendering ``true``/``false``). (templated)
    :param wait_seconds: longest wait for the in-flight checkpoint. (templated)
    :param poll_seconds: seconds between ledger reads while waiting (in the triggerer when
        deferred).
    :param deferrable: wait in the triggerer instead of a worker slot (``None``: Airflow's
        ``[operators] default_deferrable``).
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's Kafka
        config. (templated)
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the pipeline's
        ledger URL. (templated)
    """

    template_fields: Sequence[str] = (
        *PIPELINE_TEMPLATE_FIELDS,
        "savepoint_name",
        "note",
        "stop",
        "wait_seconds",
    )
    ui_color = "#f3e8fd"

    def __init__(
        self,
        *,
        pipeline: str,
        savepoint_name: str,
        note: str = "",
        stop: bool | str = False,
        wait_seconds: float | str = 600.0,
        poll_seconds: float = 2.0,
        kafka_conn_id: str | None = None,
        ledger_conn_id: str | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.savepoint_name = savepoint_name
        self.note = note
        self.stop = stop
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)

    def _arguments(self) -> tuple[str, bool, float, str]:
        """The rendered ``(name, stop, wait_s, note)``, checked."""
        name = str(self.savepoint_name).strip()
        if not re.fullmatch(SAVEPOINT_NAME_PATTERN, name):
            raise AirflowFailException(
                f"task {self.task_id!r}: savepoint name {name!r} is not allowed; use letters, digits, "
                "'.', '_' and '-' (first a letter or digit, at most 128 characters)"
            )
        stop = parse_bool(self.stop, field="stop")
        wait_s = parse_seconds(self.wait_seconds, field="wait_seconds")
        note = "" if self.note is None else str(self.note)
        return name, stop, wait_s, note

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_eo.core.savepoint import begin_savepoint, take_savepoint

        name, stop, wait_s, note = self._arguments()
        pipeline = self.resolve_pipeline()
        actor = actor_for(context)
        created_by = created_by_for(context)
        with open_ledger(pipeline) as ledger:
            done = self._already_taken(ledger, pipeline.name, name, actor.dag_id, actor.run_id)
            if done is not None:
                self.log.info(
                    "pipeline %s: savepoint %r was already recorded by this run; returning it",
                    pipeline.name,
                    name,
                )
                return done
            if self.deferrable:
                target = begin_savepoint(pipeline, ledger, name, stop=stop, actor=actor)
                return self._wait_or_record(context, pipeline, ledger, target, deadline=time.time() + wait_s)
            record = take_savepoint(
                pipeline,
                ledger,
                name,
                note=note,
                stop=stop,
                wait_s=wait_s,
                actor=actor,
                created_by=created_by,
                poll_s=self.poll_seconds,
                progress=lambda cp, waited, total: self.log.info(
                    "pipeline %s: waiting for checkpoint %s (%s) to finish: %.0fs of at most %.0fs",
                    pipeline.name,
                    cp.checkpoint_id,
                    cp.state.value,
                    waited,
                    total,
                ),
            )
        return self._summary(pipeline, record, stop)

    def _summary(self, pipeline: Any, record: Any, stop: bool) -> dict[str, Any]:
        summary: dict[str, Any] = record.summary()
        self.log.info(
            "pipeline %s: savepoint %r %s%s: %s",
            pipeline.name,
            record.name,
            record.position,
            " (pipeline stopped: `eo resume` to continue)" if stop else "",
            summary["offsets"],
        )
        return summary

    # -- deferrable: the triggerer waits, the task writes -------------------------------------

    def _wait_or_record(
        self, context: Context, pipeline: Any, ledger: Any, target: int, *, deadline: float
    ) -> dict[str, Any]:
        """Defer on the lowest checkpoint at or below ``target`` still unfinished, else record
        the savepoint. Raises :class:`~airflow_provider_eo.errors.SavepointTimeout` past
        ``deadline`` (a UNIX time)."""
        from airflow_provider_eo.core.savepoint import (
            record_savepoint,
            savepoint_timeout,
            savepoint_waits_for,
        )
        from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger

        name, stop, wait_s, note = self._arguments()
        low = savepoint_waits_for(pipeline, ledger, target)
        if low is None:
            record = record_savepoint(
                pipeline,
                ledger,
                name,
                target,
                note=note,
                actor=actor_for(context),
                created_by=created_by_for(context),
            )
            return self._summary(pipeline, record, stop)
        if time.time() >= deadline:
            raise savepoint_timeout(pipeline, name, low, wait_s, stop=stop)
        ledger_conn_id = self.ledger_connection_id()
        ledger_ref: dict[str, Any] = (
            {"ledger_conn_id": ledger_conn_id} if ledger_conn_id else {"ledger_url": pipeline.ledger_url}
        )
        self.log.info(
            "pipeline %s: savepoint %r waits for checkpoint %s (%s) in the triggerer (no worker slot held)",
            pipeline.name,
            name,
            low.checkpoint_id,
            low.state.value,
        )
        try:
            trigger = EoCheckpointTrigger(
                pipeline=pipeline.name,
                checkpoint_id=low.checkpoint_id,
                poll_interval=self.poll_seconds,
                deadline=deadline,
                wait_for="committed",
                echo={"target": target, "deadline": deadline},
                **ledger_ref,
            )
        except ValueError as exc:  # a ledger URL with a password: it must come by connection
            raise AirflowFailException(str(exc)) from exc
        self.defer(trigger=trigger, method_name="execute_complete")
        raise AssertionError("defer() raises")  # pragma: no cover

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint the savepoint waited for is COMMITTED or ABORTED (or the wait timed
        out): wait for the next one, or record the savepoint. What the wait started with comes
        back in the event (``echo``)."""
        echo = event.get("echo") or {}
        target, deadline = echo["target"], echo["deadline"]
        pipeline = self.resolve_pipeline()
        with open_ledger(pipeline) as ledger:
            if event.get("status") == "timeout":
                deadline = 0.0  # the same refusal as the blocking wait's, from the ledger's view
            return self._wait_or_record(context, pipeline, ledger, int(target), deadline=float(deadline))

    @staticmethod
    def _already_taken(
        ledger: Any, pipeline: str, name: str, dag_id: str | None, run_id: str | None
    ) -> dict[str, Any] | None:
        """The savepoint's summary when this very DAG run recorded it (a retried try)."""
        try:
            existing = ledger.get_savepoint(pipeline, name)
        except (SavepointNotFound, CheckpointNotFound):  # no such savepoint (or pipeline) yet
            return None
        if dag_id and existing.dag_id == dag_id and existing.run_id == run_id:
            summary: dict[str, Any] = existing.summary()
            return summary
        return None
