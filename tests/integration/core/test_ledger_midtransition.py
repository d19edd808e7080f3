"""The PostgreSQL ledger fails between the Kafka commit and the ledger update
(docs/design.md §3: ledger database unavailable): the committer fails loudly, and the retry
after the database is back finishes exactly once without re-sending anything.

The module starts its own PostgreSQL cluster (scripts/postgres.sh with its own state
folder) because it stops and restarts it: other tests' databases are never touched.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from eo_faultlib import (
    assert_group_offsets_match_ledger,
    finish,
    kill_child,
    marker,
    paused_commit,
    sigcont,
)
from eo_harness import Harness
from sqlalchemy.engine import make_url

from airflow_provider_eo.ledger import CheckpointState, Ledger

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "postgres.sh"
RECORDS = 120


def _pg(command: str, cluster: str) -> dict[str, str]:
    proc = subprocess.run(
        ["bash", str(SCRIPT), command],
        env={**os.environ, "EO_PG_CLUSTER": cluster},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"postgres.sh {command} failed:\n{proc.stderr[-3000:]}"
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def pg_state() -> Iterator[str]:
    """A PostgreSQL cluster of this module's own (``EO_PG_CLUSTER``), stopped at the end; the
    script puts it next to the default one, where the server's user can reach it."""
    state = "midtransition"
    _pg("start", state)
    try:
        yield state
    finally:
        _pg("stop", state)


@pytest.fixture()
def pg_ledger_url(pg_state: str, make_ledger: LedgerFactory) -> str:
    """A fresh database on the module's cluster, dropped after the test (the cluster is
    started again first: a failed test may have left it stopped)."""
    return make_ledger.url("postgres", migrated=False, server=lambda: _pg("start", pg_state)["EO_PG_URL"])


@pytest.mark.parametrize(
    ("step", "done_shards"),
    [
        ("commit.after_commit_txn", 1),  # shard 0 committed in Kafka, its shard row not yet
        ("commit.before_ledger", 2),  # every shard committed, PREPARED -> COMMITTED not yet
    ],
)
def test_ledger_down_between_kafka_commit_and_ledger_update(
    harness: Callable[..., Harness], pg_state: str, pg_ledger_url: str, step: str, done_shards: int
) -> None:
    h = harness(source_partitions=2, sink_partitions=2, commit_shards=2)
    h.ledger.close()
    h = h.with_(ledger_url=pg_ledger_url)
    try:
        _run(h, pg_state, step, done_shards)
    finally:
        h.ledger.close()


def _run(h: Harness, pg_state: str, step: str, done_shards: int) -> None:
    h.produce(RECORDS, keys=11)
    planned = h.plan()
    cid = planned.checkpoint_id
    h.prepare(cid)
    committer = paused_commit(h, step)
    try:
        _pg("stop", pg_state)
    finally:
        sigcont(committer.pid)
    try:
        code, _out, err = finish(committer)
    finally:
        kill_child(committer)
    # loudly: a non-zero exit naming the unavailable ledger, and what to do
    assert code != 0, err[-3000:]
    assert "unavailable" in err and "retry" in err, err[-3000:]
    # Kafka has committed what the markers show; nothing else
    assert [marker(h.pipeline, s) >= cid for s in range(2)] == [s < done_shards for s in range(2)]
    # postgres.sh may move the server to another port when the old one is still held
    # (TIME_WAIT): the same database, at wherever the restarted server listens.
    server = make_url(_pg("start", pg_state)["EO_PG_URL"])
    url = server.set(database=make_url(h.pipeline.ledger_url).database)
    h = h.with_(ledger_url=url.render_as_string(hide_password=False))
    h.ledger.close()
    ledger = Ledger(h.pipeline.ledger_url)  # a fresh pool: the old connections died
    try:
        assert ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
        from airflow_provider_eo.core.commit import commit_checkpoint

        result = commit_checkpoint(h.pipeline, ledger, cid)
        assert result.checkpoint.state is CheckpointState.COMMITTED
        assert result.shards_skipped == done_shards  # the committed shards were not re-sent
        assert ledger.get(h.pipeline.name, cid).state is CheckpointState.COMMITTED
        report = _audit(h, ledger)
        assert (report.duplicates, report.missing, report.unexpected) == (0, 0, 0), report.as_dict()
        assert sum(c.observed for c in report.checkpoints) == RECORDS
        assert_group_offsets_match_ledger(h.pipeline, ledger)
    finally:
        ledger.close()


def _audit(h: Harness, ledger: Ledger) -> Any:
    from airflow_provider_eo.core.audit import audit_pipeline

    return audit_pipeline(h.pipeline, ledger)
