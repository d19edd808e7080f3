"""The UI page's queries on a PostgreSQL ledger (the unit tests use SQLite): the same
answers from the same history, through the app."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.testing.ledger_fill import bulk_history, run_checkpoints
from airflow_provider_eo.ui import app as ui_app
from airflow_provider_eo.ui.lag import LagCache

pytestmark = [pytest.mark.postgres]

PARTS = [("src", 0), ("src", 1)]


def test_page_on_postgres(pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_LEDGER_URL", pg_fresh_url)
    monkeypatch.delenv("EO_LEDGER_CONN_ID", raising=False)
    with Ledger(pg_fresh_url) as ledger:
        actor = Actor(dag_id="orders_dag", run_id="r1", task_id="eo.plan", try_number=1)
        run_checkpoints(ledger, "orders", PARTS, count=4, per_partition=3, actor=actor, leave_planned=True)
        bulk_history(ledger, "bulk", PARTS, count=1200, per_partition=2, dag_id=None)
    app = ui_app.create_app()
    app.dependency_overrides[ui_app._access] = lambda: ui_app.Access("u", _only({"orders_dag", None}))
    app.state.eo.lag = LagCache(lambda parts, timeout: dict.fromkeys(parts, 30))
    client = TestClient(app)
    names = [p["name"] for p in client.get("/api/pipelines").json()["pipelines"]]
    assert names == ["bulk", "orders"]
    orders = client.get("/api/pipelines/orders").json()
    assert orders["state"] == "running" and orders["in_flight"]["checkpoint_id"] == 5
    assert orders["last_committed"]["checkpoint_id"] == 4 and orders["dag_id"] == "orders_dag"
    ids: list[int] = []
    params: dict[str, Any] = {"limit": 2}
    while True:
        page = client.get("/api/pipelines/orders/checkpoints", params=params).json()
        ids += [c["checkpoint_id"] for c in page["checkpoints"]]
        if page["next_before"] is None:
            break
        params = {"limit": 2, "before": page["next_before"]}
    assert ids == [5, 4, 3, 2, 1]
    # The bulk pipeline: no DAG among its newest checkpoints, ends from the newest commit.
    bulk = client.get("/api/pipelines/bulk").json()
    assert bulk["dag_id"] is None and bulk["checkpoints"] == 1200
    with Ledger(pg_fresh_url, create=False) as ledger:
        assert ledger.committed_ends("orders") == {("src", 0): 12, ("src", 1): 12}
        assert ledger.committed_ends("bulk") == {("src", 0): 2400, ("src", 1): 2400}


def _only(readable: set[str | None]) -> Any:
    def is_authorized(*, method: str, access_entity: Any, details: Any, user: Any) -> bool:
        return (None if details is None else details.id) in readable

    return is_authorized
