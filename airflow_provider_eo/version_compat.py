"""The one place that knows where Airflow keeps the classes this provider uses.

The provider supports Airflow 3.1 and later (``apache-airflow>=3.1``). A few names moved
into the Task SDK (``airflow.sdk``) after 3.1: each is imported from its newest home first
and from the 3.1 one otherwise, here and nowhere else. Everything else imports Airflow
names from this module.

Airflow 3.0 is not supported: its core requires SQLAlchemy < 2, and the ledger is written
for SQLAlchemy 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import (
    Asset,
    BaseHook,
    BaseOperator,
    BaseOperatorLink,
    BaseSensorOperator,
    Context,
    TaskGroup,
)
from airflow.sdk.bases.sensor import PokeReturnValue

# Registers a value with the task log's secrets masker (also applied to rendered fields).
from airflow.sdk.log import mask_secret

# Triggers still live in airflow-core on Airflow 3 (the triggerer runs them).
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
else:
    try:  # Airflow >= 3.2: the task runner catches the Task SDK's exceptions.
        from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
    except ImportError:  # Airflow 3.1: they are airflow-core's.
        from airflow.exceptions import AirflowException, AirflowFailException, AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import CronDataIntervalTimetable
else:
    try:  # Airflow >= 3.2
        from airflow.sdk import CronDataIntervalTimetable
    except ImportError:  # Airflow 3.1
        from airflow.timetables.interval import CronDataIntervalTimetable


def airflow_conf() -> Any:
    """Airflow's configuration as the running process sees it (the Task SDK's ``conf`` on
    Airflow >= 3.2, airflow-core's on 3.1)."""
    try:
        from airflow.sdk import conf as sdk_conf
    except ImportError:
        from airflow.configuration import conf as core_conf

        return core_conf
    return sdk_conf


async def request_user(request: Any) -> Any:
    """The Airflow user making ``request`` to a plugin's FastAPI app: from its bearer token,
    else from the UI's JWT cookie (what the page's browser requests carry), as Airflow's own
    ``get_user`` resolves it. Raises FastAPI's ``HTTPException`` (401/403) as Airflow does.

    Airflow 3.1.0's ``get_user`` takes no request and reads no cookie: the same precedence is
    applied here from the token resolver it shares with later versions.
    """
    import inspect

    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    credentials = await bearer_scheme(request)
    if "request" in inspect.signature(get_user).parameters:  # Airflow >= 3.1.x with cookie support
        return await get_user(request, None, credentials)
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    if credentials and credentials.scheme.lower() == "bearer":
        return await resolve_user_from_token(credentials.credentials)
    return await resolve_user_from_token(request.cookies.get(COOKIE_NAME_JWT_TOKEN))


def airflow_stats() -> Any:
    """Airflow's metrics facade ``Stats`` (``incr``, ``gauge``, ``timing`` with ``tags=``),
    sending to StatsD, Datadog or OpenTelemetry as ``[metrics]`` configures (nothing when
    no backend is on).

    Airflow >= 3.3 keeps it in the Task SDK (``airflow.sdk.observability.stats``; importing
    ``airflow.stats`` there warns), and a process initializes its backend: the task runner
    does, and so does importing ``airflow.sdk`` (its serde registry, from ``[metrics]`` as
    the process sees it then), which is how a Spark driver that spark-submit started gets
    one. A process that has none yet is initialized here. Airflow 3.1/3.2:
    ``airflow.stats.Stats``, which reads ``[metrics]`` itself on first use.
    """
    try:
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow < 3.3
        from airflow.stats import Stats

        return Stats
    try:
        from airflow.sdk._shared.observability.metrics import stats as backend
        from airflow.sdk.observability.metrics.stats_utils import get_stats_factory
    except ImportError:  # a layout this module does not know: Stats as it is
        return Stats
    if getattr(backend, "_factory", False) is None:  # never initialized in this process
        conf = airflow_conf()
        backend.initialize(
            factory=get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True),
        )
    return Stats


def default_deferrable() -> bool:
    """Airflow's ``[operators] default_deferrable`` (what an operator's ``deferrable=None``
    means, as in Airflow's own providers)."""
    from airflow.configuration import conf

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def set_outlet_extra(context: Context | Mapping[str, Any], asset: Asset, extra: Mapping[str, Any]) -> None:
    """Make ``extra`` the ``extra`` of the event Airflow emits for the running task's outlet
    ``asset`` when the task succeeds (``context["outlet_events"][asset].extra``, the same on
    Airflow 3.1 to 3.3). Replaces what was set before, so a repeated call does not merge."""
    accessor = context["outlet_events"][asset]
    accessor.extra.clear()
    accessor.extra.update(extra)


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
    "Asset",
    "BaseEventTrigger",
    "BaseHook",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "CronDataIntervalTimetable",
    "PokeReturnValue",
    "TaskGroup",
    "TriggerEvent",
    "airflow_conf",
    "airflow_stats",
    "default_deferrable",
    "mask_secret",
    "request_user",
    "set_outlet_extra",
    "task_identity",
]
