"""The streaming loop's logic (core.stream.drive_stream) over fake protocol steps: resume
order, pipelining, back-pressure, stop, stopped pipeline, commit failure."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_provider_eo.core.stream import StreamCheckpoint, StreamSteps, drive_stream, run_stream
from airflow_provider_eo.core.stream_contract import StreamArgsError
from airflow_provider_eo.errors import CommitError, PipelineStopped
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState

PLANNED, PREPARED, COMMITTED = CheckpointState.PLANNED, CheckpointState.PREPARED, CheckpointState.COMMITTED


class FakeLedger:
    """Checkpoint states as the ledger keeps them; refuses what the real one refuses."""

    def __init__(self, max_pending: int, states: dict[int, CheckpointState] | None = None) -> None:
        self.max_pending = max_pending
        self.states: dict[int, CheckpointState] = dict(states or {})
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.commit_gate: threading.Event | None = None  # set: commits may proceed
        self.stopped = False
        self.fail_commit: int | None = None
        self.available = 10**9  # checkpoints' worth of input

    def _record(self, cid: int, state: CheckpointState) -> CheckpointRecord:
        rec: Any = type("Rec", (), {"checkpoint_id": cid, "state": state, "records": 10})()
        return rec  # type: ignore[no-any-return]

    def unfinished_ids(self) -> list[int]:
        return sorted(c for c, s in self.states.items() if s in (PLANNED, PREPARED))

    def steps(self) -> StreamSteps:
        def plan_next() -> CheckpointRecord | None:
            with self.lock:
                if self.stopped:
                    raise PipelineStopped("pipeline 'p' is stopped", pipeline="p")
                if self.available <= 0:
                    return None
                if len(self.unfinished_ids()) >= self.max_pending:
                    raise AssertionError("planned past max_pending")
                cid = max(self.states, default=0) + 1
                self.states[cid] = PLANNED
                self.available -= 1
                self.calls.append(f"plan:{cid}")
                return self._record(cid, PLANNED)

        def prepare(cid: int) -> tuple[int, float]:
            with self.lock:
                assert self.states[cid] is PLANNED
                self.states[cid] = PREPARED
                self.calls.append(f"prepare:{cid}")
            return 10, 0.0

        def commit(cid: int) -> float:
            if self.commit_gate is not None:
                assert self.commit_gate.wait(10)
            with self.lock:
                assert self.states[cid] is PREPARED
                assert all(s is COMMITTED for c, s in self.states.items() if c < cid), "out of order"
                if cid == self.fail_commit:
                    raise CommitError(f"checkpoint {cid}: broker gone")
                self.states[cid] = COMMITTED
                self.calls.append(f"commit:{cid}")
            return 0.0

        def unfinished() -> list[CheckpointRecord]:
            with self.lock:
                return [self._record(c, self.states[c]) for c in self.unfinished_ids()]

        return StreamSteps(
            plan_next=plan_next,
            prepare=prepare,
            commit=commit,
            unfinished=unfinished,
            state=lambda cid: self.states[cid],
        )


def run(fake: FakeLedger, **kw: Any) -> Any:
    kw.setdefault("interval_s", 0.01)
    return drive_stream(fake.steps(), pipeline="p", max_pending=fake.max_pending, **kw)


def test_resumes_unfinished_in_order_before_planning() -> None:
    fake = FakeLedger(3, {1: COMMITTED, 2: PREPARED, 3: PLANNED})
    result = run(fake, max_checkpoints=4)
    assert fake.calls.index("plan:4") > fake.calls.index("prepare:3")  # resumed first
    assert [c for c in fake.calls if c.startswith("commit")] == [f"commit:{i}" for i in (2, 3, 4, 5)]
    assert [c.checkpoint_id for c in result.checkpoints] == [2, 3, 4, 5]
    assert [c.resumed for c in result.checkpoints] == [True, True, False, False]
    assert fake.unfinished_ids() == [] and result.unfinished == []
    assert result.reason == "checkpoints" and result.records == 40


def test_prepare_of_the_next_overlaps_the_commit_of_the_last() -> None:
    fake = FakeLedger(2)
    fake.commit_gate = threading.Event()
    seen: list[StreamCheckpoint] = []

    def opener() -> None:  # commits stay blocked until checkpoint 2 was prepared
        while "prepare:2" not in fake.calls:
            threading.Event().wait(0.01)
        assert fake.commit_gate is not None
        fake.commit_gate.set()

    t = threading.Thread(target=opener)
    t.start()
    result = run(fake, max_checkpoints=3, on_checkpoint=seen.append)
    t.join()
    assert fake.calls.index("prepare:2") < fake.calls.index("commit:1")
    assert [c.checkpoint_id for c in seen] == [1, 2, 3]
    assert all(c.state == "COMMITTED" and c.commit_s is not None for c in seen)
    assert result.unfinished == []


def test_airflow_mode_stops_planning_at_max_pending() -> None:
    fake = FakeLedger(2)
    result = run(fake, commit="airflow", duration_s=0.5, interval_s=0.02)
    assert fake.states == {1: PREPARED, 2: PREPARED}  # nothing past max_pending, nobody commits
    assert not any(c.startswith("commit") for c in fake.calls)
    assert result.backpressure_waits >= 5
    assert result.unfinished == [1, 2] and result.reason == "duration"
    assert all(c.commit_s is None for c in result.checkpoints)


def test_airflow_mode_plans_again_once_someone_else_commits() -> None:
    fake = FakeLedger(1)

    def airflow_commits() -> None:
        while fake.states.get(1) is not PREPARED:
            threading.Event().wait(0.01)
        with fake.lock:
            fake.states[1] = COMMITTED

    t = threading.Thread(target=airflow_commits)
    t.start()
    result = run(fake, commit="airflow", max_checkpoints=2, interval_s=0.02)
    t.join()
    assert fake.states == {1: COMMITTED, 2: PREPARED}
    assert result.unfinished == [2]


def test_stop_event_finishes_in_flight_checkpoints() -> None:
    fake = FakeLedger(3)
    stop = threading.Event()
    fake.commit_gate = threading.Event()

    def stopper() -> None:
        while "prepare:2" not in fake.calls:
            threading.Event().wait(0.01)
        stop.set()
        assert fake.commit_gate is not None
        fake.commit_gate.set()

    t = threading.Thread(target=stopper)
    t.start()
    result = run(fake, stop=stop)
    t.join()
    assert result.reason == "signal"
    assert fake.unfinished_ids() == [] and result.unfinished == []
    assert all(s is COMMITTED for s in fake.states.values())


def test_stopped_pipeline_ends_cleanly_after_in_flight() -> None:
    fake = FakeLedger(2, {1: PREPARED})
    fake.stopped = True
    result = run(fake)
    assert result.reason == "stopped"
    assert fake.states == {1: COMMITTED}


def test_nothing_new_counts_empty_intervals() -> None:
    fake = FakeLedger(1)
    fake.available = 2
    result = run(fake, duration_s=0.3)
    assert len(result.checkpoints) == 2 and result.empty_intervals >= 3


def test_commit_failure_stops_and_raises_later_ones_stay_prepared() -> None:
    fake = FakeLedger(3)
    fake.fail_commit = 2
    with pytest.raises(CommitError, match="checkpoint 2"):
        run(fake, duration_s=5.0)
    assert fake.states[1] is COMMITTED and fake.states[2] is PREPARED
    assert all(s is not COMMITTED for c, s in fake.states.items() if c > 2)


@pytest.mark.parametrize(
    ("kw", "match"), [({"commit": "later"}, "commit must be"), ({"interval_s": 0}, "interval")]
)
def test_bad_arguments(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(FakeLedger(1), **kw)


class Untouchable:
    """A pipeline, ledger or stager that fails the test when used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"touched {name}: the refusal came after work started")


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"heartbeat_s": 0}, "heartbeat must be"), ({"interval_s": -1}, "interval must be")],
)
def test_run_stream_refuses_a_bad_setting_before_registering_a_run(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(StreamArgsError, match=match):
        run_stream(Untouchable(), ledger=Untouchable(), stager=Untouchable(), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("full", [True, False])
def test_a_full_plan_plans_the_next_without_waiting_for_the_interval(full: bool) -> None:
    # A plan cut by max_records_per_checkpoint means input is waiting (a backlog): the next
    # plan follows at once (bounded by max_pending), else the stream would carry at most
    # max_records_per_checkpoint per interval however much is waiting.
    fake = FakeLedger(2)
    steps = fake.steps()
    steps.full = lambda cp: full
    result = drive_stream(steps, pipeline="p", max_pending=2, interval_s=3.0, max_checkpoints=3)
    assert [c.checkpoint_id for c in result.checkpoints] == [1, 2, 3]
    if full:
        assert result.seconds < 2.0  # three checkpoints, no interval waited
    else:
        assert result.seconds >= 6.0  # not full: one plan per interval
