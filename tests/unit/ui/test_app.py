"""The page's API on a SQLite ledger, with the caller's access decided by a fake auth manager:
JSON shapes, keyset pagination, per-DAG filtering, the lag cache. The real auth path (tokens,
cookies, Airflow's auth manager) is tested against a real api-server in
tests/integration/airflow/test_ui.py."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from eo_harness import wait_for
from fastapi.testclient import TestClient

from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.testing.ledger_fill import run_checkpoints
from airflow_provider_eo.ui import app as ui_app
from airflow_provider_eo.ui.lag import LagCache

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

PARTS = [("src", 0), ("src", 1)]


@pytest.fixture()
def ledger(make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """The ledger the page reads (``EO_LEDGER_URL``)."""
    url = make_ledger.url()
    monkeypatch.setenv("EO_LEDGER_URL", url)
    monkeypatch.delenv("EO_LEDGER_CONN_ID", raising=False)
    return make_ledger(url=url)


def _client(
    readable: set[str | None], triggerable: set[str], ends: dict[Any, int] | None = None
) -> TestClient:
    app = ui_app.create_app()

    def is_authorized(*, method: str, access_entity: Any, details: Any, user: Any) -> bool:
        dag_id = None if details is None else details.id
        return dag_id in (readable if method == "GET" else triggerable)

    app.dependency_overrides[ui_app._access] = lambda: ui_app.Access("someone", is_authorized)
    app.state.eo.lag = LagCache(lambda parts, timeout: {tp: ends[tp] for tp in parts} if ends else {})
    return TestClient(app)


def test_overview_history_pages_and_savepoint_rights(ledger: Ledger) -> None:
    actor = Actor(dag_id="orders_dag", run_id="r1", task_id="eo.plan", try_number=1)
    run_checkpoints(ledger, "orders", PARTS, count=5, per_partition=3, actor=actor, leave_planned=True)
    ledger.abort("orders", 6, reason="spark died: exit code 3")
    client = _client({"orders_dag"}, {"eo_savepoint"}, ends={("src", 0): 20, ("src", 1): 15})

    listed = client.get("/api/pipelines").json()["pipelines"]
    (p,) = listed
    assert p["name"] == "orders" and p["state"] == "failing" and p["dag_id"] == "orders_dag"
    assert p["last_committed"]["checkpoint_id"] == 5 and p["in_flight"] is None
    assert p["last_error"] == {
        "checkpoint_id": 6,
        "at": p["last_error"]["at"],
        "reason": "spark died: exit code 3",
    }
    assert p["actions"]["can_savepoint"] is True and p["actions"]["can_control"] is False
    assert p["links"] == {"dag": "dags/orders_dag", "runs": "dags/orders_dag/runs"}

    seen: list[int] = []
    before = None
    while True:
        params = {"limit": 2} if before is None else {"limit": 2, "before": before}
        page = client.get("/api/pipelines/orders/checkpoints", params=params).json()
        seen += [c["checkpoint_id"] for c in page["checkpoints"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == [6, 5, 4, 3, 2, 1]  # newest first, every checkpoint once
    first = client.get("/api/pipelines/orders/checkpoints", params={"limit": 1, "before": 6}).json()
    (c5,) = first["checkpoints"]
    assert c5["state"] == "COMMITTED" and c5["records"] == 6 and c5["records_planned"] == 6
    assert c5["ranges"] == [
        {"topic": "src", "partition": 0, "start": 12, "end": 15},
        {"topic": "src", "partition": 1, "start": 12, "end": 15},
    ]
    assert c5["prepare_s"] is not None and c5["commit_s"] is not None and c5["run_id"] == "r1"
    assert client.get("/api/pipelines/orders/checkpoints", params={"limit": 0}).status_code == 422
    assert client.get("/api/pipelines/orders/checkpoints", params={"limit": 501}).status_code == 422
    assert client.get("/api/pipelines/nope").status_code == 404


def test_lag_never_waits_and_is_log_end_minus_committed_end(ledger: Ledger) -> None:
    run_checkpoints(ledger, "orders", PARTS, count=2, per_partition=4, leave_planned=True)
    client = _client({None}, set(), ends={("src", 0): 20, ("src", 1): 8})
    first = client.get("/api/pipelines/orders/lag").json()
    assert first["state"] in ("pending", "ok")
    wait_for(
        lambda: client.get("/api/pipelines/orders/lag").json()["state"] == "ok", "the lag read", timeout=10
    )
    lag = client.get("/api/pipelines/orders/lag").json()
    # Committed ends are 8 (the PLANNED checkpoint 3 does not count): lag 12 + 0.
    assert lag["state"] == "ok" and lag["total"] == 12
    assert [(r["partition"], r["committed_end"], r["log_end"], r["lag"]) for r in lag["partitions"]] == [
        (0, 8, 20, 12),
        (1, 8, 8, 0),
    ]


def test_lag_reader_that_hangs_does_not_block_the_page(ledger: Ledger) -> None:
    run_checkpoints(ledger, "orders", PARTS, count=1, per_partition=1)
    app = ui_app.create_app()
    app.dependency_overrides[ui_app._access] = lambda: ui_app.Access("u", lambda **kw: True)

    kafka_answers = threading.Event()

    def hang(parts: Any, timeout: float) -> dict[Any, int]:
        kafka_answers.wait(30)  # Kafka does not answer until the test lets it
        raise TimeoutError("no answer")

    app.state.eo.lag = LagCache(hang)
    client = TestClient(app)
    try:
        t0 = time.monotonic()
        body = client.get("/api/pipelines/orders").json()
        assert time.monotonic() - t0 < 2.5, "the page waited for Kafka"
        assert body["lag"]["state"] == "pending" and body["lag"]["total"] is None
    finally:
        kafka_answers.set()


def test_pipelines_of_dags_the_user_may_not_read_are_hidden_and_refused(ledger: Ledger) -> None:
    run_checkpoints(ledger, "a", PARTS, count=1, per_partition=1, actor=Actor(dag_id="dag_a", run_id="r"))
    run_checkpoints(ledger, "b", PARTS, count=1, per_partition=1, actor=Actor(dag_id="dag_b", run_id="r"))
    client = _client({"dag_a"}, set())
    assert [p["name"] for p in client.get("/api/pipelines").json()["pipelines"]] == ["a"]
    for path in (
        "/api/pipelines/b",
        "/api/pipelines/b/checkpoints",
        "/api/pipelines/b/lag",
        "/api/pipelines/b/savepoints",
    ):
        response = client.get(path)
        assert response.status_code == 403 and "dag_b" in response.json()["detail"], path
    assert client.get("/api/pipelines/a/savepoints").json() == {"savepoints": []}


def test_page_is_served() -> None:
    client = TestClient(ui_app.create_app())
    html = client.get("/").text
    assert 'id="eo-take-savepoint"' in html and "api/v2/dags/" in html


def test_lag_after_a_restore_counts_from_the_restore_offset(ledger: Ledger) -> None:
    run_checkpoints(ledger, "orders", PARTS, count=3, per_partition=5)
    ledger.restore("orders", {("src", 0): 2, ("src", 1): 4}, reason="restore from savepoint sp1")
    # The new lineage committed nothing yet: its ends are the restore offsets, not 15.
    assert ledger.committed_ends("orders") == {("src", 0): 2, ("src", 1): 4}
    run_checkpoints(ledger, "orders", PARTS, count=1, per_partition=1)
    assert ledger.committed_ends("orders") == {("src", 0): 3, ("src", 1): 5}
    page = _client({None}, set()).get("/api/pipelines/orders/checkpoints").json()
    assert [b["lineage"] for b in page["lineage_breaks"]] == [2]
    assert "sp1" in page["lineage_breaks"][0]["reason"]
