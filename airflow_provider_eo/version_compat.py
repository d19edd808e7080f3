"""The one place that knows where Airflow keeps the classes this provider uses.

The package requires Airflow 3 (``apache-airflow>=3.3``), so there is no version branch
today; when a future Airflow moves a class, its check goes here and nowhere else.
Everything else imports Airflow names from this module.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator, Context, TaskGroup
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
)

# Registers a value with the task log's secrets masker (also applied to rendered fields).
from airflow.sdk.log import mask_secret

# Triggers still live in airflow-core on Airflow 3 (the triggerer runs them).
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent


def default_deferrable() -> bool:
    """Airflow's ``[operators] default_deferrable`` (what an operator's ``deferrable=None``
    means, as in Airflow's own providers)."""
    from airflow.configuration import conf

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


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
    "AirflowException",
    "AirflowFailException",
    "AirflowSkipException",
    "BaseEventTrigger",
    "BaseHook",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "PokeReturnValue",
    "TaskGroup",
    "TriggerEvent",
    "default_deferrable",
    "mask_secret",
    "task_identity",
]
