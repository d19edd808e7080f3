"""Random plan/prepare/commit/abort/restore sequences against a tiny model of the ledger."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from airflow_provider_eo.ledger import (
    CheckpointConflict,
    CheckpointState,
    InvariantViolation,
    Ledger,
    RangeSpec,
)

P = "pipe"
KEYS = [("a", 0), ("a", 1), ("b", 0)]
UNFINISHED = {"PLANNED", "PREPARED"}


class LedgerMachine(RuleBasedStateMachine):
    template: Path
    workdir: Path
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        path = self.workdir / f"m{next(self.counter)}.db"
        shutil.copyfile(self.template, path)
        self.ledger = Ledger(f"sqlite:///{path}", create=False)
        self.ledger.ensure_pipeline(P, "fp")
        self.states: dict[int, str] = {}
        self.ranges: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        self.attempts: dict[int, str] = {}
        self.heads: dict[tuple[str, int], int] = {}
        self.lineage = 1
        self.lineage_of: dict[int, int] = {}

    def teardown(self) -> None:
        self.ledger.close()

    def _unfinished(self) -> list[int]:
        return sorted(i for i, s in self.states.items() if s in UNFINISHED)

    @rule(
        keys=st.sets(st.sampled_from(KEYS), min_size=1),
        length=st.integers(0, 5),
        mode=st.sampled_from(["ok", "ok", "ok", "gap", "overlap"]),
        fresh_start=st.integers(0, 50),
        max_pending=st.integers(1, 3),
    )
    def plan(
        self, keys: set[tuple[str, int]], length: int, mode: str, fresh_start: int, max_pending: int
    ) -> None:
        specs = []
        wrong = False
        for key in sorted(keys):
            start = self.heads.get(key, fresh_start)
            if key in self.heads and mode == "gap":
                start += 1
                wrong = True
            elif key in self.heads and mode == "overlap" and start > 0:
                start -= 1
                wrong = True
            specs.append(RangeSpec(key[0], key[1], start, start + length))
        expect_fail = len(self._unfinished()) >= max_pending or wrong
        try:
            rec = self.ledger.plan(P, specs, max_pending=max_pending)
        except InvariantViolation:
            assert expect_fail
            return
        assert not expect_fail
        new_id = len(self.states) + 1
        assert rec.checkpoint_id == new_id and rec.lineage == self.lineage
        self.states[new_id] = "PLANNED"
        self.ranges[new_id] = {s.key: (s.start, s.end) for s in specs}
        self.lineage_of[new_id] = self.lineage
        for s in specs:
            self.heads[s.key] = s.end

    def _pick(self, data: st.DataObject) -> int:
        return data.draw(st.integers(1, max(1, len(self.states) + 1)))

    @rule(data=st.data(), attempt=st.sampled_from(["x", "y"]))
    def prepare(self, data: st.DataObject, attempt: str) -> None:
        cp = self._pick(data)
        state = self.states.get(cp)
        try:
            self.ledger.mark_prepared(
                P, cp, attempt=attempt, staging_location="s", records=1, bytes_=1, shard_counts={0: 1}
            )
        except CheckpointConflict:
            assert state is not None and not (state == "PREPARED" and self.attempts[cp] == attempt)
            assert state != "PLANNED"
            return
        except LookupError:
            raise
        except Exception as exc:  # CheckpointNotFound
            assert state is None, exc
            return
        assert state == "PLANNED" or (state == "PREPARED" and self.attempts[cp] == attempt)
        self.states[cp] = "PREPARED"
        self.attempts[cp] = attempt

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        cp = self._pick(data)
        state = self.states.get(cp)
        earlier = [i for i in self._unfinished() if i < cp]
        try:
            self.ledger.mark_committed(P, cp)
        except CheckpointConflict:
            assert state in ("PLANNED", "ABORTED")
            return
        except InvariantViolation:
            assert state == "PREPARED" and earlier
            return
        except Exception as exc:
            assert state is None, exc
            return
        assert state == "COMMITTED" or (state == "PREPARED" and not earlier)
        self.states[cp] = "COMMITTED"

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        cp = self._pick(data)
        state = self.states.get(cp)
        try:
            self.ledger.abort(P, cp, reason="r")
        except CheckpointConflict:
            assert state == "COMMITTED"
            return
        except Exception as exc:
            assert state is None, exc
            return
        if state == "ABORTED":
            return
        assert state in UNFINISHED
        victims = [cp] + [i for i in self._unfinished() if i > cp]
        seen: set[tuple[str, int]] = set()
        for v in victims:
            self.states[v] = "ABORTED"
            for key, (start, _end) in self.ranges[v].items():
                if key not in seen:
                    seen.add(key)
                    self.heads[key] = start

    @rule(offsets=st.dictionaries(st.sampled_from(KEYS), st.integers(0, 60), max_size=3))
    def restore(self, offsets: dict[tuple[str, int], int]) -> None:
        try:
            lineage = self.ledger.restore(P, offsets, reason="r")
        except InvariantViolation:
            assert self._unfinished()
            return
        assert not self._unfinished()
        self.lineage += 1
        assert lineage == self.lineage
        self.heads = dict(offsets)

    @invariant()
    def matches_model(self) -> None:
        unfinished = self.ledger.unfinished(P)
        model_unfinished = self._unfinished()
        assert (unfinished.checkpoint_id if unfinished else None) == (
            model_unfinished[0] if model_unfinished else None
        )
        committed = sorted(i for i, s in self.states.items() if s == "COMMITTED")
        last = self.ledger.last_committed(P)
        assert (last.checkpoint_id if last else None) == (committed[-1] if committed else None)
        assert self.ledger.next_starts(P) == self.heads
        records = self.ledger.list_checkpoints(P)
        assert {r.checkpoint_id: r.state.value for r in records} == self.states
        # Commit order: nothing committed after an unfinished checkpoint.
        if committed and model_unfinished:
            assert committed[-1] < model_unfinished[0]
        # Contiguity per lineage over non-aborted checkpoints, read from the ledger itself.
        ends: dict[tuple[int, tuple[str, int]], int] = {}
        for r in records:
            if r.state == CheckpointState.ABORTED:
                continue
            for g in r.ranges:
                prev = ends.get((r.lineage, g.key))
                assert prev is None or prev == g.start, (r, prev)
                ends[(r.lineage, g.key)] = g.end


def test_ledger_state_machine(ledger_template: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        LedgerMachine.template = ledger_template
        LedgerMachine.workdir = Path(work)
        run_state_machine_as_test(
            LedgerMachine,
            settings=settings(
                max_examples=40,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
