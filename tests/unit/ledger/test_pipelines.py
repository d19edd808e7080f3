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
