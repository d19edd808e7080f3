"""take_savepoint / stop / resume against a SQLite ledger (no Kafka: they only use the ledger)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_eo.core.savepoint import resume_pipeline, stop_pipeline, take_savepoint, who
from airflow_provider_eo.errors import SavepointTimeout
from airflow_provider_eo.ledger import Actor, InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.ledger.savepoints import NothingCommitted
from airflow_provider_eo.pipeline import Pipeline

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

PIPE = Pipeline(
    name="orders", kafka={"bootstrap.servers": "localhost:9"}, source_topics=["in"], sink_topic="out"
)


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(pipeline="orders")


def _cp(ledger: Ledger, start: int, end: int, *, commit: bool = True) -> int:
    cid = ledger.plan("orders", [RangeSpec("in", 0, start, end)]).checkpoint_id
    ledger.mark_prepared(
        "orders", cid, attempt="a", staging_location="/s", records=end - start, bytes_=1, shard_counts={0: 1}
    )
    if commit:
        ledger.mark_committed("orders", cid)
    return cid


def test_waits_for_the_in_flight_checkpoint_and_never_takes_a_later_one(ledger: Ledger) -> None:
    _cp(ledger, 0, 10)
    in_flight = _cp(ledger, 10, 20, commit=False)
    seen: list[int] = []

    def progress(cp: Any, waited: float, wait_s: float) -> None:
        # while the savepoint waits: the in-flight one commits and a later one too
        seen.append(cp.checkpoint_id)
        ledger.mark_committed("orders", in_flight)
        _cp(ledger, 20, 30)

    sp = take_savepoint(PIPE, ledger, "sp", poll_s=0.01, progress=progress, created_by="me")
    assert seen == [in_flight]
    assert (sp.checkpoint_id, sp.offsets, sp.created_by) == (in_flight, {"in": {0: 20}}, "me")
    assert not ledger.get_pipeline("orders").stopped


def test_aborted_in_flight_points_at_the_newest_committed_below(ledger: Ledger) -> None:
    first = _cp(ledger, 0, 10)
    in_flight = _cp(ledger, 10, 20, commit=False)

    def progress(cp: Any, waited: float, wait_s: float) -> None:
        ledger.abort("orders", in_flight, reason="test")

    sp = take_savepoint(PIPE, ledger, "sp", poll_s=0.01, progress=progress, stop=True)
    assert sp.checkpoint_id == first and sp.offsets == {"in": {0: 10}}
    assert ledger.get_pipeline("orders").stopped


def test_timeout_leaves_the_stop_and_says_so(ledger: Ledger) -> None:
    _cp(ledger, 0, 10)
    stuck = _cp(ledger, 10, 20, commit=False)
    with pytest.raises(SavepointTimeout, match=f"checkpoint {stuck} is still PREPARED.*stays STOPPED"):
        take_savepoint(PIPE, ledger, "sp", stop=True, wait_s=0.05, poll_s=0.01)
    assert ledger.get_pipeline("orders").stopped and ledger.list_savepoints("orders") == []


def test_refusals_happen_before_the_stop(ledger: Ledger) -> None:
    with pytest.raises(NothingCommitted, match="'orders' has no COMMITTED checkpoint yet"):
        take_savepoint(PIPE, ledger, "sp", stop=True)
    _cp(ledger, 0, 10)
    take_savepoint(PIPE, ledger, "sp")
    events = ledger.events("orders")
    with pytest.raises(InvariantViolation, match=r"savepoint .sp. already exists.*eo savepoint delete"):
        take_savepoint(PIPE, ledger, "sp", stop=True)
    assert ledger.events("orders") == events and not ledger.get_pipeline("orders").stopped


def test_stop_resume_and_who(ledger: Ledger) -> None:
    airflow = Actor(dag_id="eo_savepoint", run_id="manual__1", task_id="t")
    assert who(airflow).startswith("eo_savepoint/manual__1/t")
    assert "@" in who(None)
    p = stop_pipeline(PIPE, ledger, reason="maintenance", actor=airflow)
    assert p.stopped and p.stopped_by is not None and p.stopped_by.startswith("eo_savepoint/manual__1")
    assert not resume_pipeline(PIPE, ledger).stopped


def test_a_savepoint_after_a_restore_says_it_is_before_the_first_checkpoint(ledger: Ledger) -> None:
    """Nothing committed since the restore: the savepoint names the restore's offsets and no
    checkpoint, and messages say so (never "checkpoint None")."""
    _cp(ledger, 0, 10)
    ledger.restore("orders", {("in", 0): 5}, reason="replay")
    sp = take_savepoint(PIPE, ledger, "replay-start")
    assert (sp.checkpoint_id, sp.offsets) == (None, {"in": {0: 5}})
    assert sp.position == "before the first checkpoint, at the offsets a restore or reset started from"
    for take in (
        lambda: take_savepoint(PIPE, ledger, "replay-start"),
        lambda: ledger.savepoint_at_checkpoint("orders", "replay-start"),
    ):
        with pytest.raises(InvariantViolation, match="already exists") as refused:
            take()
        assert "None" not in str(refused.value) and "before the first checkpoint" in str(refused.value)
