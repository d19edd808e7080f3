"""The Airflow plugin that mounts the "Exactly-once" page (registered by the package's
``airflow.plugins`` entry point, so installing the provider is enough).

- ``fastapi_apps``: :mod:`airflow_provider_eo.ui.app` at ``/eo`` in the api-server;
- ``external_views``: an "Exactly-once" entry in the UI's navigation (the page in an iframe);
- ``operator_extra_links``: :class:`~airflow_provider_eo.ui.links.EoCheckpointLink`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_eo.ui.links import EoCheckpointLink

#: Where the api-server mounts the app.
URL_PREFIX = "/eo"


def _fastapi_apps() -> list[dict[str, object]]:
    from airflow_provider_eo.ui.app import app

    return [{"app": app, "url_prefix": URL_PREFIX, "name": "Exactly-once"}]


class EoPlugin(AirflowPlugin):
    """Pipelines, checkpoints, lag and savepoints in the Airflow UI."""

    name = "eo"
    fastapi_apps = _fastapi_apps()
    external_views = [
        {
            "name": "Exactly-once",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "exactly-once",
            "category": "browse",
        }
    ]
    operator_extra_links = [EoCheckpointLink()]
