"""A savepoint names the CURRENT lineage's position (SQLite file and PostgreSQL).

After a restore or reset the pipeline's position is the new lineage's start until a
checkpoint of that lineage commits; the previous lineage's newest COMMITTED checkpoint is
history. A savepoint naming it would make a later restore from that savepoint skip the
range the restore asked to process again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.ledger.savepoints import NothingCommitted

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

P = "orders"


@pytest.fixture
def ledger(ledger_url: str, make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(url=ledger_url, pipeline=P)


def _commit(ledger: Ledger, start: int, end: int) -> int:
    """Plan, prepare and commit one checkpoint reading ``[start, end)`` of t[0] and t[1]."""
    cid = ledger.plan(P, [RangeSpec("t", 0, start, end), RangeSpec("t", 1, start, end)]).checkpoint_id
    ledger.mark_prepared(P, cid, attempt="a", staging_location="/s", records=1, bytes_=1, shard_counts={0: 1})
    ledger.mark_committed(P, cid)
    return cid


def _three(ledger: Ledger) -> list[int]:
    return [_commit(ledger, 0, 10), _commit(ledger, 10, 20), _commit(ledger, 20, 30)]


@pytest.mark.parametrize("bounded", [False, True], ids=["newest", "at_or_below_in_flight"])
def test_savepoint_right_after_restore_names_the_restored_offsets(ledger: Ledger, bounded: bool) -> None:
    third = _three(ledger)[-1]
    ledger.restore(P, {("t", 0): 10, ("t", 1): 10}, reason="re-process 10..30")
    # stop-with-savepoint asks at or below the highest checkpoint id handed out (3 here)
    at_or_below = ledger.get_pipeline(P).last_checkpoint_id if bounded else None
    assert at_or_below in (None, third)
    sp = ledger.savepoint_at_checkpoint(P, "after-restore", at_or_below=at_or_below)
    assert sp.offsets == {"t": {0: 10, 1: 10}}
    assert sp.checkpoint_id is None  # no checkpoint of this lineage has committed
    assert ledger.get_savepoint(P, "after-restore") == sp
    event = ledger.events(P)[-1]
    assert event.kind == "savepoint" and event.checkpoint_id is None
    assert event.details["lineage"] == 2 and event.details["offsets"] == {"t": {"0": 10, "1": 10}}

    # Restoring from it processes 10..30 again: the next plan must start at 10, not 30.
    _commit(ledger, 10, 15)
    ledger.restore(P, {("t", int(p)): o for p, o in sp.offsets["t"].items()}, reason="from savepoint")
    assert ledger.next_starts(P) == {("t", 0): 10, ("t", 1): 10}


def test_savepoint_after_a_commit_in_the_new_lineage_names_that_commit(ledger: Ledger) -> None:
    _three(ledger)
    ledger.restore(P, {("t", 0): 10, ("t", 1): 10}, reason="re-process")
    fourth = _commit(ledger, 10, 15)
    sp = ledger.savepoint_at_checkpoint(P, "a")
    assert (sp.checkpoint_id, sp.offsets) == (fourth, {"t": {0: 15, 1: 15}})
    # bounded below the new lineage's first checkpoint: still this lineage (its start)
    below = ledger.savepoint_at_checkpoint(P, "b", at_or_below=fourth - 1)
    assert (below.checkpoint_id, below.offsets) == (None, {"t": {0: 10, 1: 10}})


def test_savepoint_after_a_full_reset_is_refused_and_records_nothing(ledger: Ledger) -> None:
    _three(ledger)
    ledger.restore(P, {}, reason="reset: start where the startup policy says")
    before = ledger.events(P)
    with pytest.raises(NothingCommitted, match=r"lineage 2 .*reset.* no COMMITTED checkpoint"):
        ledger.savepoint_at_checkpoint(P, "a")
    assert ledger.events(P) == before and ledger.list_savepoints(P) == []
    fourth = _commit(ledger, 50, 60)
    assert ledger.savepoint_at_checkpoint(P, "a").checkpoint_id == fourth
