"""One transactional-id namespace per pipeline, pinned in the ledger.

Kafka fences a committer only through its own ``transactional.id``; a committer configured
with another prefix would publish alongside the first one. The ledger pins the prefix with
the pipeline's first plan and refuses any committer (or planner) with another one, whatever
its clock says about the commit lease.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, finish, kill_child, paused_commit, sigcont

from airflow_provider_eo.errors import EoError
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 120


def test_committer_with_another_prefix_is_refused(
    harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committer A (prefix ``eo``) holds the lease and stops with its transaction open.
    Committer B, configured with prefix ``other`` and a clock a day ahead (so A's lease looks
    expired to it), tries the same checkpoint: it must be refused before producing anything.
    Before the pin, B published everything under its own ids and A, resumed, published it
    all again (Kafka could not fence A: another transactional id)."""
    from airflow_provider_eo.ledger import engine, leases

    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(RECORDS, keys=9)
    cid = h.plan().checkpoint_id
    h.prepare(cid)
    first = paused_commit(h, "commit.before_commit_txn")
    other = h.with_(transactional_id_prefix="other")
    ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    for module in (engine, leases):
        monkeypatch.setattr(module, "utcnow", lambda: ahead, raising=False)
    refused: EoError | None = None
    try:
        try:
            other.commit(cid)
        except EoError as exc:
            refused = exc
        monkeypatch.undo()
    finally:
        sigcont(first.pid)
    try:
        code, _out, err = finish(first)
    finally:
        kill_child(first)
    assert code == 0, err[-3000:]
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    assert refused is not None, "a committer with another transactional-id prefix was let through"
    message = str(refused)
    for word in (h.pipeline.name, "'eo'", "'other'", "transactional_id_prefix"):
        assert word in message, message
    # A planner with the other prefix is refused too.
    with pytest.raises(EoError, match="transactional_id_prefix"):
        other.plan()
