"""Stream runs on SQLite and PostgreSQL: one live run per pipeline even when two start at
once, staleness on the database's clock (a worker clock running ahead changes nothing)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from eo_harness import wait_for

from airflow_provider_eo.ledger import Ledger
from airflow_provider_eo.ledger.streams import StreamRunConflict

P = "streamed"


def _register(ledger: Ledger, run_id: str, heartbeat_s: float = 5.0) -> Any:
    return ledger.register_stream_run(
        P, run_id=run_id, host="h", pid=1, commit_mode="inline", heartbeat_s=heartbeat_s
    )


def test_two_runs_starting_at_once_one_wins(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(P, "fp")
    outcomes: dict[str, str] = {}
    start = threading.Barrier(2)

    def start_run(run_id: str) -> None:
        with Ledger(ledger_url) as ledger:
            start.wait()
            try:
                _register(ledger, run_id)
                outcomes[run_id] = "running"
            except StreamRunConflict:
                outcomes[run_id] = "refused"

    threads = [threading.Thread(target=start_run, args=(r,)) for r in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes.values()) == ["refused", "running"], outcomes


def test_staleness_is_judged_on_the_database_clock(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.ledger import engine

    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(P, "fp")
        _register(ledger, "a", heartbeat_s=0.2)
        # A worker whose clock runs an hour ahead does not see the live run as stale.
        ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
        monkeypatch.setattr(engine, "utcnow", lambda: ahead)
        with pytest.raises(StreamRunConflict):
            _register(ledger, "b")
        monkeypatch.undo()
        live = ledger.live_stream_run(P)
        assert live is not None and live.run_id == "a" and (live.heartbeat_age_s or 0) < 5
        # Nobody beats: poll until the run counts as stale (4 heartbeats of silence).
        wait_for(lambda: ledger.live_stream_run(P) is None, "the silent run to go stale", timeout=10)
        assert _register(ledger, "b").state == "RUNNING"
        assert ledger.get_stream_run("a").state == "LOST"
        assert ledger.request_stream_stop(P, requested_by="ops") == ["b"]
        assert ledger.heartbeat_stream_run("b").stop_requested_by == "ops"
        ended = ledger.end_stream_run("b", state="ENDED", reason="stop requested", summary={"records": 3})
        assert ended.state == "ENDED" and ended.summary == {"records": 3}
