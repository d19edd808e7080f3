"""From a DAG run's checkpoint to the "Exactly-once" page: an operator extra link."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow_provider_eo.version_compat import BaseOperatorLink

#: The attribute an operator sets once it knows its checkpoint: ``(pipeline, checkpoint_id)``.
LINK_ATTR = "_eo_checkpoint_link"


def checkpoint_page_url(pipeline: str, checkpoint_id: int | None, base_url: str = "") -> str:
    """The page's URL for ``pipeline`` (and its checkpoint ``checkpoint_id``)."""
    query: dict[str, Any] = {"pipeline": pipeline}
    if checkpoint_id is not None:
        query["checkpoint"] = checkpoint_id
    return f"{base_url.rstrip('/')}/eo/?{urlencode(query)}"


class EoCheckpointLink(BaseOperatorLink):
    """ "Checkpoint": the pipeline's page on the checkpoint this task planned or committed.

    Airflow 3 computes an extra link in the worker right after the task ran and keeps it in
    XCom; the operator leaves ``(pipeline, checkpoint_id)`` on itself for that.
    """

    name = "Checkpoint"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The page's URL, or "" when the task had no checkpoint (skipped, failed early)."""
        found = getattr(operator, LINK_ATTR, None)
        if not found:
            return ""
        pipeline, checkpoint_id = found
        try:
            from airflow_provider_eo.version_compat import airflow_conf

            base_url = str(airflow_conf().get("api", "base_url", fallback="") or "")
        except Exception:  # a relative link still works when Airflow is served at /
            base_url = ""
        return checkpoint_page_url(pipeline, checkpoint_id, base_url)
