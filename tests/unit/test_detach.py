"""The detached launcher's settling of a run once spark-submit exited (detach.py)."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_eo.detach import settle_run
from airflow_provider_eo.ledger import Ledger

P = "orders"


def test_settle_run_records_what_the_application_could_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger(url) as ledger:
        ledger.ensure_pipeline(P, "fp")
    # spark-submit failed before the application registered: a FAILED row with its error.
    assert settle_run(url, P, "never", failure="AirflowException: bad --conf", log_path="/l") == (
        "recorded: never started"
    )
    with Ledger(url) as ledger:
        never = ledger.get_stream_run("never")
        assert never.state == "FAILED" and "never started: AirflowException: bad --conf" in never.reason
        # The driver died without ending its row (SIGKILL): FAILED at once, not after staleness.
        ledger.register_stream_run(P, run_id="killed", host="h", pid=1, commit_mode="inline", heartbeat_s=5)
    assert (
        settle_run(url, P, "killed", failure="exit 137", log_path="/l")
        == "recorded: died without ending its run"
    )
    with Ledger(url) as ledger:
        killed = ledger.get_stream_run("killed")
        assert killed.state == "FAILED" and "exited without ending its run" in killed.reason
        # The application ended its row itself: left alone.
        ledger.register_stream_run(P, run_id="clean", host="h", pid=1, commit_mode="inline", heartbeat_s=5)
        ledger.end_stream_run("clean", state="ENDED", reason="checkpoints", summary={"checkpoints": 1})
    assert (
        settle_run(url, P, "clean", failure=None, log_path="/l")
        == "the application ended its run itself (ENDED)"
    )
    with Ledger(url) as ledger:
        assert ledger.get_stream_run("clean").state == "ENDED"
        # A live run of another process: the failed start is not recorded over it.
        ledger.register_stream_run(P, run_id="live", host="h", pid=1, commit_mode="inline", heartbeat_s=60)
    assert settle_run(url, P, "late", failure="x", log_path="/l").startswith("not recorded")
