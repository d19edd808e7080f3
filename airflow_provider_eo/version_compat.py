"""The one place that knows where Airflow keeps its classes (Airflow 3 ``airflow.sdk``,
with Airflow 2 fallbacks). Everything else imports Airflow names from here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Triggers still live in airflow-core on Airflow 3 (the triggerer runs them).
from airflow.triggers.base import BaseTrigger, TriggerEvent


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


try:
    from airflow import __version__ as AIRFLOW_VERSION
except ImportError:  # pragma: no cover - Airflow always has it
    AIRFLOW_VERSION = "0"

AIRFLOW_V_3_0_PLUS = _version_tuple(AIRFLOW_VERSION) >= (3, 0)

if TYPE_CHECKING or AIRFLOW_V_3_0_PLUS:
    from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, TaskGroup
    from airflow.sdk.bases.sensor import PokeReturnValue
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
    )
else:  # pragma: no cover - Airflow 2 layout
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
    )
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from airflow.models import BaseOperator  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator, PokeReturnValue  # type: ignore[no-redef]
    from airflow.utils.context import Context  # type: ignore[no-redef]
    from airflow.utils.task_group import TaskGroup  # type: ignore[no-redef]


def task_identity(context: Context | dict[str, Any]) -> dict[str, Any]:
    """``dag_id``, ``run_id``, ``task_id``, ``try_number`` of the running task instance."""
    ti = context["ti"]
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "try_number": int(ti.try_number) if ti.try_number is not None else None,
    }


__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_V_3_0_PLUS",
    "AirflowException",
    "AirflowFailException",
    "AirflowSkipException",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "PokeReturnValue",
    "TaskGroup",
    "TriggerEvent",
    "task_identity",
]
