"""Several processes race to move the same checkpoint: exactly one wins, every round."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec

WORKER = Path(__file__).with_name("race_worker.py")
PROCS = 4
ROUNDS = 12
pytestmark = pytest.mark.timeout(120)


class Workers:
    def __init__(self, url: str) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(WORKER), url, f"w{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(PROCS)
        ]
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()  # blocks until the worker is connected
            assert line == "ready", f"worker failed to start: {line!r}"

    def race(self, cmd: dict[str, object]) -> list[dict[str, object]]:
        payload = json.dumps(cmd) + "\n"
        for p in self.procs:  # every worker is blocked on readline: they all go at once
            assert p.stdin is not None
            p.stdin.write(payload)
            p.stdin.flush()
        results = []
        for p in self.procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.readline()))
        return results

    def close(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in self.procs:
            p.wait(timeout=30)


@pytest.fixture
def race(ledger_url: str) -> Iterator[tuple[Ledger, Workers]]:
    ledger = Ledger(ledger_url)
    ledger.ensure_pipeline("race", "fp")
    workers = Workers(ledger_url)
    try:
        yield ledger, workers
    finally:
        workers.close()
        ledger.close()


def _one_winner(results: list[dict[str, object]], allowed: set[str]) -> None:
    winners = [r for r in results if r["ok"]]
    assert len(winners) == 1, results
    errors = Counter(str(r["error"]) for r in results if not r["ok"])
    assert set(errors) <= allowed, results


def test_prepare_race(race: tuple[Ledger, Workers]) -> None:
    ledger, workers = race
    start = 0
    for rnd in range(ROUNDS):
        cp = ledger.plan("race", [RangeSpec("t", 0, start, start + 10)]).checkpoint_id
        _one_winner(workers.race({"op": "prepare", "cp": cp}), {"CheckpointConflict"})
        rec = ledger.get("race", cp)
        assert rec.prepared_attempt is not None and rec.prepared_attempt.startswith("w")
        assert [e.to_state for e in ledger.events("race", cp)].count(rec.state) == 1
        if rnd % 3 == 2:
            ledger.abort("race", cp, reason="replan")
        else:
            _one_winner(workers.race({"op": "lease", "cp": cp}), {"CommitLeaseHeld"})
            ledger.mark_committed("race", cp)
            start += 10


def test_plan_race(race: tuple[Ledger, Workers]) -> None:
    ledger, workers = race
    for rnd in range(ROUNDS):
        start = ledger.next_starts("race").get(("t", 0), 0)
        results = workers.race({"op": "plan", "ranges": [["t", 0, start, start + 5]]})
        _one_winner(results, {"CheckpointConflict", "InvariantViolation"})
        checkpoints = ledger.list_checkpoints("race")
        unfinished = [c for c in checkpoints if not c.finished]
        assert len(unfinished) == 1, checkpoints
        cp = unfinished[0].checkpoint_id
        assert ledger.get_pipeline("race").last_checkpoint_id == cp == len(checkpoints)
        if rnd % 2:
            ledger.abort("race", cp, reason="replan")
        else:
            ledger.mark_prepared(
                "race", cp, attempt="main", staging_location="s", records=5, bytes_=5, shard_counts={0: 5}
            )
            ledger.mark_committed("race", cp)
    committed = [c for c in ledger.list_checkpoints("race") if c.state.value == "COMMITTED"]
    assert [c.ranges[0].start for c in committed] == [5 * i for i in range(len(committed))]
