"""Take a named savepoint of a pipeline from Airflow (optionally stopping it first)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from airflow_provider_eo.ledger import CheckpointNotFound, SavepointNotFound
from airflow_provider_eo.operators.base import (
    PIPELINE_TEMPLATE_FIELDS,
    PipelineTaskMixin,
    actor_for,
    open_ledger,
)
from airflow_provider_eo.version_compat import AirflowFailException, BaseOperator, Context

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

    **Waiting holds a worker slot.** The task polls the ledger (every ``poll_seconds``,
    at most ``wait_seconds``) until nothing that was in flight when it started is
    unfinished. It does not defer: that wait is one checkpoint's prepare and commit
    (normally minutes, and the pipeline's own DAG runs them), the stop must be recorded
    before waiting and the savepoint right after, and a trigger must never write the
    ledger. Past ``wait_seconds`` the task fails (a retry waits again; a stop stays in
    place and the error says so).

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
    :param poll_seconds: seconds between ledger reads while waiting.
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_pipeline_args(pipeline=pipeline, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id)
        self.savepoint_name = savepoint_name
        self.note = note
        self.stop = stop
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_eo.core.savepoint import take_savepoint

        name = str(self.savepoint_name).strip()
        if not re.fullmatch(SAVEPOINT_NAME_PATTERN, name):
            raise AirflowFailException(
                f"task {self.task_id!r}: savepoint name {name!r} is not allowed; use letters, digits, "
                "'.', '_' and '-' (first a letter or digit, at most 128 characters)"
            )
        stop = parse_bool(self.stop, field="stop")
        wait_s = parse_seconds(self.wait_seconds, field="wait_seconds")
        note = "" if self.note is None else str(self.note)
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
        summary = record.summary()
        self.log.info(
            "pipeline %s: savepoint %r %s%s: %s",
            pipeline.name,
            name,
            record.position,
            " (pipeline stopped: `eo resume` to continue)" if stop else "",
            summary["offsets"],
        )
        return summary

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
