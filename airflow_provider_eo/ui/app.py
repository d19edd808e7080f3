"""The "Exactly-once" page's FastAPI app, mounted by the Airflow api-server at ``/eo``.

Airflow does not protect a plugin's endpoints by itself: every ``/eo/api/...`` endpoint
here resolves the caller through Airflow's own ``get_user`` (the ``Authorization: Bearer``
header or the UI's session cookie) and asks Airflow's auth manager whether that user may
read the pipeline's DAG. Anonymous requests get 401, an invalid token 403, a user who may
not read the DAG 403 (and the pipeline list leaves that pipeline out).

Settings (Airflow config section ``[eo]``, or the environment as noted):

- ``ledger_conn_id`` (``$EO_LEDGER_CONN_ID``): the ledger's connection; without it the
  pipelines' default ledger (``$EO_LEDGER_URL``, else ``<eo home>/ledger.db``);
- ``kafka_conn_id`` (``$EO_KAFKA_CONN_ID``, else ``$EO_KAFKA_BOOTSTRAP``): the Kafka
  cluster lag is read from;
- ``savepoint_dag_id`` (``eo_savepoint``) and ``control_dag_id`` (``eo_control``): the
  DAGs the page's buttons trigger through Airflow's REST API.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse

from airflow_provider_eo.ledger import CheckpointNotFound, Ledger
from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.urls import default_ledger_url, redact_url
from airflow_provider_eo.ui.lag import LagCache

#: The DAGs the buttons trigger, unless ``[eo] savepoint_dag_id`` / ``control_dag_id`` say otherwise.
DEFAULT_SAVEPOINT_DAG = "eo_savepoint"
DEFAULT_CONTROL_DAG = "eo_control"


def _setting(key: str, env: str | None = None, default: str | None = None) -> str | None:
    from airflow.configuration import conf

    value = conf.get("eo", key, fallback=None)
    if value:
        return str(value)
    if env and os.environ.get(env):
        return os.environ[env]
    return default


def ledger_url_from_settings() -> str:
    """The ledger the page reads: ``[eo] ledger_conn_id`` / ``$EO_LEDGER_CONN_ID``, else the
    pipelines' default ledger URL."""
    conn_id = _setting("ledger_conn_id", "EO_LEDGER_CONN_ID")
    if conn_id:
        from airflow_provider_eo.hooks.ledger import LedgerHook

        return LedgerHook(conn_id, create=False).get_url()
    return default_ledger_url()


def kafka_config_from_settings() -> dict[str, Any] | None:
    """The librdkafka config lag is read with, None when nothing is configured."""
    conn_id = _setting("kafka_conn_id", "EO_KAFKA_CONN_ID")
    if conn_id:
        from airflow_provider_eo.hooks.kafka import EoKafkaHook

        return EoKafkaHook(conn_id).get_config()
    bootstrap = os.environ.get("EO_KAFKA_BOOTSTRAP")
    return {"bootstrap.servers": bootstrap} if bootstrap else None


def read_log_ends(partitions: list[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], int]:
    """Log end offsets (last stable offsets) of ``partitions``, bounded by ``timeout_s``."""
    from airflow_provider_eo.kafka import admin

    config = kafka_config_from_settings()
    if config is None:
        raise LookupError(
            "no Kafka cluster configured for the page: set [eo] kafka_conn_id (or $EO_KAFKA_CONN_ID)"
        )
    return admin.list_offsets(config, partitions, spec="latest", timeout_s=timeout_s)


# -- auth ------------------------------------------------------------------------------------


class Access:
    """What the caller may do, asked of Airflow's auth manager per DAG (cached per request)."""

    def __init__(self, user: Any, is_authorized: Callable[..., bool]) -> None:
        self.user = user
        self._is_authorized = is_authorized
        self._cache: dict[tuple[str, str | None], bool] = {}

    def can(self, method: str, dag_id: str | None) -> bool:
        """May the user ``GET`` (read) or ``POST`` (trigger a run of) ``dag_id``? A pipeline
        no DAG has run yet (``None``) needs that access to every DAG."""
        key = (method, dag_id)
        if key not in self._cache:
            from airflow.api_fastapi.auth.managers.models.resource_details import (
                DagAccessEntity,
                DagDetails,
            )

            self._cache[key] = bool(
                self._is_authorized(
                    method=method,
                    access_entity=DagAccessEntity.RUN if method == "POST" else None,
                    details=DagDetails(id=dag_id) if dag_id else None,
                    user=self.user,
                )
            )
        return self._cache[key]


async def _access(request: Request) -> Access:
    from airflow.api_fastapi.app import get_auth_manager

    from airflow_provider_eo.version_compat import request_user

    user = await request_user(request)
    return Access(user, get_auth_manager().is_authorized_dag)


AccessDep = Annotated[Access, Depends(_access)]


# -- the app ---------------------------------------------------------------------------------


class _State:
    """The app's ledger (opened once, read-only: the page never migrates it) and lag cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledger: Ledger | None = None
        self._url: str | None = None
        self.lag = LagCache(read_log_ends)

    @property
    def ledger_url(self) -> str:
        """The URL of the ledger last opened ("" before the first request)."""
        return self._url or ""

    def ledger(self) -> Ledger:
        url = ledger_url_from_settings()
        with self._lock:
            if self._ledger is None or url != self._url:
                if self._ledger is not None:
                    self._ledger.close()
                try:
                    self._ledger = Ledger(url, create=False)
                except LedgerError as exc:
                    raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
                self._url = url
            return self._ledger


def _pipeline_ref(dag_id: str | None, run_id: str | None, task_id: str | None) -> str | None:
    """The pipeline's ``MODULE:ATTR`` as its plan task rendered it (Airflow's rendered
    template fields), so the savepoint form is filled in; None when Airflow no longer has it."""
    if not (dag_id and run_id and task_id):
        return None
    try:
        from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            fields = session.execute(
                select(RTIF.rendered_fields).where(
                    RTIF.dag_id == dag_id, RTIF.run_id == run_id, RTIF.task_id == task_id
                )
            ).scalar_one_or_none()
    except Exception:  # best effort: the form's field stays editable
        return None
    ref = (fields or {}).get("pipeline") if isinstance(fields, Mapping) else None
    return str(ref) if ref and ":" in str(ref) else None


def create_app() -> FastAPI:
    """The plugin's FastAPI app (mounted at ``/eo`` by :class:`~airflow_provider_eo.ui.plugin.EoPlugin`)."""
    app = FastAPI(
        title="airflow-provider-eo: Exactly-once",
        description="Pipelines, checkpoints, lag and savepoints from the exactly-once ledger.",
    )
    state = _State()
    app.state.eo = state

    def readable(access: Access, ledger: Ledger, name: str) -> dict[str, Any]:
        try:
            overview = ledger.pipeline_overview(name)
        except CheckpointNotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"pipeline {name!r} is not in the ledger") from exc
        if not access.can("GET", overview["dag_id"]):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"you may not read DAG {overview['dag_id'] or '(all DAGs)'}, which runs pipeline {name!r}",
            )
        return overview

    def decorate(access: Access, overview: dict[str, Any], *, ref: bool) -> dict[str, Any]:
        savepoint_dag = _setting("savepoint_dag_id", default=DEFAULT_SAVEPOINT_DAG) or DEFAULT_SAVEPOINT_DAG
        control_dag = _setting("control_dag_id", default=DEFAULT_CONTROL_DAG) or DEFAULT_CONTROL_DAG
        dag_id = overview["dag_id"]
        last = overview["last_checkpoint"] or {}
        overview["actions"] = {
            "savepoint_dag_id": savepoint_dag,
            "control_dag_id": control_dag,
            "can_savepoint": access.can("POST", savepoint_dag),
            "can_control": access.can("POST", control_dag),
        }
        overview["links"] = {
            "dag": f"dags/{dag_id}" if dag_id else None,
            "runs": f"dags/{dag_id}/runs" if dag_id else None,
        }
        if ref:
            overview["pipeline_ref"] = _pipeline_ref(
                last.get("dag_id"), last.get("run_id"), _plan_task(overview)
            )
        return overview

    def _plan_task(overview: dict[str, Any]) -> str | None:
        last = overview["last_checkpoint"]
        if not last:
            return None
        ledger = state.ledger()
        try:
            return ledger.get(overview["name"], last["checkpoint_id"]).task_id
        except CheckpointNotFound:
            return None

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        """The page (static HTML + script; its data comes from the authenticated API)."""
        html = resources.files("airflow_provider_eo.ui").joinpath("static/index.html").read_text()
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/pipelines")
    def pipelines(access: AccessDep) -> dict[str, Any]:
        """Every pipeline the caller may read, at a glance."""
        ledger = state.ledger()
        out = []
        for name in ledger.pipeline_names():
            try:
                overview = ledger.pipeline_overview(name)
            except CheckpointNotFound:  # deleted between the two reads
                continue
            if access.can("GET", overview["dag_id"]):
                committed = ledger.committed_ends(name)
                overview["lag"] = state.lag.lag(name, committed)
                out.append(decorate(access, overview, ref=False))
        return {"ledger": redact_url(state.ledger_url), "pipelines": out}

    @app.get("/api/pipelines/{name}")
    def pipeline(name: str, access: AccessDep) -> dict[str, Any]:
        """One pipeline: overview, lag, savepoints, and what the caller may trigger."""
        ledger = state.ledger()
        overview = readable(access, ledger, name)
        overview["lag"] = state.lag.lag(name, ledger.committed_ends(name))
        overview["savepoints"] = [sp.summary() for sp in reversed(ledger.list_savepoints(name))]
        return decorate(access, overview, ref=True)

    @app.get("/api/pipelines/{name}/checkpoints")
    def checkpoints(
        name: str,
        access: AccessDep,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        before: Annotated[int | None, Query(ge=1)] = None,
    ) -> dict[str, Any]:
        """Checkpoint history, newest first, ``limit`` per page; ``next_before`` pages on."""
        ledger = state.ledger()
        readable(access, ledger, name)
        return ledger.checkpoint_page(name, limit=limit, before=before)

    @app.get("/api/pipelines/{name}/lag")
    def lag(name: str, access: AccessDep) -> dict[str, Any]:
        """Lag per partition and in total (cached log ends: never waits on Kafka)."""
        ledger = state.ledger()
        readable(access, ledger, name)
        return state.lag.lag(name, ledger.committed_ends(name))

    @app.get("/api/pipelines/{name}/savepoints")
    def savepoints(name: str, access: AccessDep) -> dict[str, Any]:
        """The pipeline's savepoints, newest first."""
        ledger = state.ledger()
        readable(access, ledger, name)
        return {"savepoints": [sp.summary() for sp in reversed(ledger.list_savepoints(name))]}

    return app


app = create_app()
