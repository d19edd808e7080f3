"""Stream runs in the ledger (eo_stream_runs): one live run per pipeline, heartbeats on the
database's clock, LOST after silence or a dead process, stop requests, idempotent ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.ledger.streams import (
    StreamRunConflict,
    StreamRunNotFound,
    StreamRunSuperseded,
)

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

P = "orders"


@pytest.fixture()
def ledger(make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(pipeline=P)


def _register(ledger: Ledger, run_id: str, heartbeat_s: float = 5.0, **kw: Any) -> Any:
    return ledger.register_stream_run(
        P, run_id=run_id, host="h1", pid=100, commit_mode="inline", heartbeat_s=heartbeat_s, **kw
    )


def test_a_second_live_run_is_refused_naming_the_first(ledger: Ledger) -> None:
    first = _register(ledger, "r1")
    assert first.state == "RUNNING" and first.heartbeat_age_s == 0.0
    with pytest.raises(StreamRunConflict, match=r"already runs \(run r1 on h1, pid 100") as err:
        _register(ledger, "r2")
    assert err.value.other.run_id == "r1"
    assert ledger.live_stream_run(P).run_id == "r1"  # type: ignore[union-attr]


def test_a_silent_run_is_lost_and_a_new_one_takes_over(ledger: Ledger) -> None:
    _register(ledger, "r1", heartbeat_s=0.05)
    # Nobody beats: poll until the run counts as stale (4 heartbeats of silence).
    wait_for(lambda: ledger.live_stream_run(P) is None, "the silent run to go stale", timeout=10)
    second = _register(ledger, "r2")
    old = ledger.get_stream_run("r1")
    assert old.state == "LOST" and "no heartbeat since" in old.reason
    assert second.state == "RUNNING"
    # The lost run learns it at its next beat and must stop at once.
    with pytest.raises(StreamRunSuperseded, match="r1 is LOST"):
        ledger.heartbeat_stream_run("r1")
    assert ledger.events(P)[-2].kind == "stream_lost"


def test_a_run_whose_process_is_gone_is_lost_at_once(ledger: Ledger) -> None:
    _register(ledger, "r1")
    second = _register(ledger, "r2", dead=["r1"])
    assert second.state == "RUNNING"
    assert ledger.get_stream_run("r1").state == "LOST"
    assert "h1:100 is gone" in ledger.get_stream_run("r1").reason


def test_heartbeat_carries_the_stop_request_and_ends_are_idempotent(ledger: Ledger) -> None:
    _register(ledger, "r1")
    assert ledger.heartbeat_stream_run("r1").stop_requested_at is None
    assert ledger.request_stream_stop(P, requested_by="ops") == ["r1"]
    assert ledger.request_stream_stop(P, requested_by="later") == ["r1"]  # the first stays
    beat = ledger.heartbeat_stream_run("r1")
    assert beat.stop_requested_at is not None and beat.stop_requested_by == "ops"
    ended = ledger.end_stream_run("r1", state="ENDED", reason="signal", summary={"checkpoints": 2})
    assert ended.state == "ENDED" and ended.summary == {"checkpoints": 2} and ended.ended_at
    again = ledger.end_stream_run("r1", state="FAILED", reason="late", error="x")
    assert again.state == "ENDED" and again.reason == "signal"  # the first ending stays
    assert ledger.request_stream_stop(P, requested_by="ops") == []  # nothing runs
    assert ledger.live_stream_run(P) is None
    _register(ledger, "r2")  # a new run after an ended one


def test_unknown_runs_and_bad_endings(ledger: Ledger) -> None:
    with pytest.raises(StreamRunNotFound):
        ledger.get_stream_run("nope")
    _register(ledger, "r1")
    with pytest.raises(ValueError, match="ENDED, FAILED or LOST"):
        ledger.end_stream_run("r1", state="RUNNING", reason="")
    with pytest.raises(Exception, match="registered already"):
        _register(ledger, "r1")


def test_the_ui_overview_shows_the_newest_stream_run(ledger: Ledger) -> None:
    assert ledger.pipeline_overview(P)["stream"] is None  # never streamed
    _register(ledger, "r1", heartbeat_s=0.05)
    live = ledger.pipeline_overview(P)["stream"]
    assert live["run_id"] == "r1" and live["state"] == "RUNNING"
    assert (live["host"], live["pid"]) == ("h1", 100)
    wait_for(
        lambda: ledger.pipeline_overview(P)["stream"]["state"] == "STALE", "the run to show STALE", timeout=10
    )
    ledger.end_stream_run("r1", state="FAILED", reason="KafkaException: boom", error="tb")
    ended = ledger.pipeline_overview(P)["stream"]
    assert ended["state"] == "FAILED" and ended["reason"] == "KafkaException: boom" and ended["ended_at"]
