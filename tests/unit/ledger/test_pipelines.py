"""Pipeline registration and its settings fingerprint."""

from __future__ import annotations

import pytest

from airflow_provider_eo.ledger import (
    Ledger,
    PipelineFingerprintMismatch,
    RangeSpec,
)

P = "orders"


def test_fingerprint_mismatch(ledger: Ledger) -> None:
    assert ledger.ensure_pipeline(P, "fp-1").fingerprint == "fp-1"  # idempotent
    with pytest.raises(PipelineFingerprintMismatch) as info:
        ledger.ensure_pipeline(P, "fp-2")
    msg = str(info.value)
    assert "'orders'" in msg and "fp-1" in msg and "fp-2" in msg
    assert "allow_fingerprint_change=True" in msg
    assert ledger.get_pipeline(P).fingerprint == "fp-1"
    changed = ledger.ensure_pipeline(P, "fp-2", allow_fingerprint_change=True)
    assert changed.fingerprint == "fp-2"
    assert ledger.events(P)[-1].details == {"old": "fp-1", "new": "fp-2"}
    assert [p.name for p in ledger.list_pipelines()] == [P]


def test_pipelines_are_independent(ledger: Ledger) -> None:
    ledger.ensure_pipeline("other", "x")
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    assert ledger.plan("other", [RangeSpec("t", 0, 500, 510)]).checkpoint_id == 1
    assert ledger.unfinished("other").ranges[0].start == 500  # type: ignore[union-attr]


def test_stop_and_resume_are_idempotent_with_one_event_each(ledger: Ledger) -> None:
    from airflow_provider_eo.errors import PipelineStopped
    from airflow_provider_eo.ledger import RangeSpec

    stopped = ledger.stop_pipeline("orders", stopped_by="alice@h", reason="upgrade")
    assert stopped.stopped and stopped.stopped_by == "alice@h" and stopped.stop_reason == "upgrade"
    again = ledger.stop_pipeline("orders", stopped_by="bob@h", reason="other")
    assert (again.stopped_by, again.stopped_at) == ("alice@h", stopped.stopped_at)  # first stop kept
    # the ledger's plan refuses under the row lock
    with pytest.raises(PipelineStopped, match=r"'orders' is stopped \(by alice@h.*upgrade.*eo resume"):
        ledger.plan("orders", [RangeSpec("t", 0, 0, 1)])
    resumed = ledger.resume_pipeline("orders", resumed_by="carol@h")
    assert not resumed.stopped and resumed.stopped_by is None
    assert not ledger.resume_pipeline("orders", resumed_by="carol@h").stopped
    kinds = [e.kind for e in ledger.events("orders")]
    assert kinds.count("stop") == 1 and kinds.count("resume") == 1
    resume = next(e for e in ledger.events("orders") if e.kind == "resume")
    assert resume.details["cleared"]["stopped_by"] == "alice@h"
    ledger.plan("orders", [RangeSpec("t", 0, 0, 1)])


def test_stop_of_an_unknown_pipeline_is_refused(ledger: Ledger) -> None:
    from airflow_provider_eo.ledger import CheckpointNotFound

    with pytest.raises(CheckpointNotFound, match="pipeline 'nope' is not in the ledger"):
        ledger.stop_pipeline("nope", stopped_by="x", reason="y")
