"""The checkpoint coordinator (core/coordinator.py): its step table, the order in which it
tells its listeners, and that every entry point over it (run_once, run_backfill, the
stream's steps, the Structured Streaming sink's batch) sends the same metrics; a spark-mode
backfill without a shard runner commits here against the fake Kafka."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, fake_pipeline, patched_broker, prepared_checkpoint

from airflow_provider_eo import names
from airflow_provider_eo.core import backfill, batches, coordinator
from airflow_provider_eo.core.commit import CommitResult
from airflow_provider_eo.core.coordinator import Coordinator, Planned, next_step
from airflow_provider_eo.core.metrics import (
    CHECKPOINT_RECORDS,
    COMMIT_SECONDS,
    DEAD_LETTERS,
    LAG_RECORDS,
    PREPARE_SECONDS,
    RecordingSink,
)
from airflow_provider_eo.core.prepare import PrepareResult
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CheckpointState, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
SHARDS = 1
SINK_PARTITIONS = 1
RANGES = (RangeSpec("in", 0, 0, 10),)

#: What a stream sends for one checkpoint it prepared and committed (core/stream_steps.py).
STREAM_METRICS = {
    ("seconds", PREPARE_SECONDS),
    ("count", CHECKPOINT_RECORDS),
    ("count", DEAD_LETTERS),
    ("seconds", COMMIT_SECONDS),
    ("gauge", LAG_RECORDS),
}


# -- the step table (pure) ---------------------------------------------------------------------


def _cp(state: CheckpointState, checkpoint_id: int = 1) -> CheckpointRecord:
    return SimpleNamespace(checkpoint_id=checkpoint_id, state=state)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("state", "step"),
    [
        (None, "nothing"),
        (CheckpointState.PLANNED, "prepare"),
        (CheckpointState.PREPARED, "commit"),
        (CheckpointState.COMMITTED, "skip"),
    ],
)
def test_each_state_calls_for_one_step(state: CheckpointState | None, step: str) -> None:
    assert next_step(None if state is None else _cp(state)) == step


def test_an_aborted_checkpoint_is_never_continued() -> None:
    with pytest.raises(ValueError, match="ABORTED"):
        next_step(_cp(CheckpointState.ABORTED))


# -- step order and listeners, the protocol steps faked ----------------------------------------


class Recorder:
    """A listener that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []

    def planned(self, cp: CheckpointRecord) -> None:
        self.events.append(("planned", cp.checkpoint_id))

    def prepared(self, cp: CheckpointRecord, seconds: float | None) -> None:
        self.events.append(("prepared" if seconds is not None else "prepared already", cp.checkpoint_id))

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        self.events.append(("committed", cp.checkpoint_id))

    def failed(self, step: str, checkpoint_id: int | None, error: BaseException) -> None:
        self.events.append((f"failed {step}", checkpoint_id))


class Broken(Recorder):
    """A listener that fails at every event."""

    def planned(self, cp: CheckpointRecord) -> None:
        raise RuntimeError("listener down")

    def prepared(self, cp: CheckpointRecord, seconds: float | None) -> None:
        raise RuntimeError("listener down")

    def committed(self, cp: CheckpointRecord, seconds: float | None) -> None:
        raise RuntimeError("listener down")


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return dataclasses.replace(fake_pipeline(tmp_path, sink=OUT, shards=SHARDS), transform="m:f")


@pytest.fixture
def ledger(pipeline: Pipeline, tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        led.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        yield led


@pytest.fixture
def fake_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """plan, prepare and commit as ledger moves only (no Kafka, no engine); the lag read
    finds 5 records past every end. Returns the calls, in order."""
    calls: list[str] = []

    def plan(
        pipeline: Pipeline, ledger: Ledger, *, actor: Any = None, next_only: bool = False, clients: Any = None
    ) -> Any:
        calls.append("plan")
        unfinished = None if next_only else ledger.unfinished(pipeline.name)
        if unfinished is not None:
            return unfinished
        if ledger.last_committed(pipeline.name) is not None:
            return None
        return ledger.plan(pipeline.name, list(RANGES), commit_plan=names.commit_plan(pipeline, 1))

    def prepare(pipeline: Pipeline, ledger: Ledger, cid: int, **kw: Any) -> PrepareResult:
        calls.append("prepare")
        cp = ledger.get(pipeline.name, cid)
        if cp.state is not CheckpointState.PLANNED:
            return PrepareResult(cp, None, cp.records or 0, 0, 0.0)
        cp = ledger.mark_prepared(
            pipeline.name, cid, attempt="a1", staging_location="x", records=7, bytes_=70, shard_counts={0: 7}
        )
        return PrepareResult(cp, "a1", 7, 10, 0.25)

    def commit(pipeline: Pipeline, ledger: Ledger, cid: int, **kw: Any) -> CommitResult:
        calls.append("commit")
        cp = ledger.get(pipeline.name, cid)
        if cp.state is CheckpointState.COMMITTED:
            return CommitResult(cp, 0, 0, 0.0, note="already COMMITTED")
        ledger.record_shard(
            pipeline.name,
            cid,
            0,
            transactional_id=f"eo.{pipeline.name}.0",
            producer_id=None,
            producer_epoch=None,
            state="COMMITTED",
            records=7,
        )
        return CommitResult(ledger.mark_committed(pipeline.name, cid), 7, 0, 0.5)

    monkeypatch.setattr(coordinator, "plan_checkpoint", plan)
    monkeypatch.setattr(coordinator, "prepare_checkpoint", prepare)
    monkeypatch.setattr(coordinator, "commit_checkpoint", commit)
    monkeypatch.setattr(admin, "list_offsets", lambda config, tps, **kw: {tp: 15 for tp in tps})
    return calls


def test_a_new_checkpoint_is_planned_prepared_then_committed(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    heard = Recorder()
    coord = Coordinator(pipeline, ledger, listeners=[heard])
    planned = coord.plan()
    assert planned.step == "prepare" and planned.checkpoint is not None
    result = coord.finish(planned, lambda cid: coord.prepare(cid, stager=None))  # type: ignore[arg-type]
    assert result is not None and result.checkpoint.state is CheckpointState.COMMITTED
    assert fake_steps == ["plan", "prepare", "commit"]
    assert heard.events == [("planned", 1), ("prepared", 1), ("committed", 1)]
    # Nothing new: no step runs, nobody is told.
    assert coord.finish(coord.plan()) is None
    assert fake_steps[3:] == ["plan"] and len(heard.events) == 3


def test_a_resumed_prepared_checkpoint_is_only_committed_and_a_repeat_is_not_reported(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    cp = ledger.plan(pipeline.name, list(RANGES), commit_plan=names.commit_plan(pipeline, 1))
    ledger.mark_prepared(
        pipeline.name,
        cp.checkpoint_id,
        attempt="a0",
        staging_location="x",
        records=7,
        bytes_=70,
        shard_counts={0: 7},
    )
    heard = Recorder()
    coord = Coordinator(pipeline, ledger, listeners=[heard])
    planned = coord.plan()
    assert planned.step == "commit"
    coord.finish(planned)  # no prepare needed: none given
    coord.commit(cp.checkpoint_id)  # committing a COMMITTED checkpoint: not reported again
    assert fake_steps == ["plan", "commit", "commit"]
    assert heard.events == [("planned", 1), ("committed", 1)]


def test_a_planned_checkpoint_without_a_prepare_is_refused(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    coord = Coordinator(pipeline, ledger)
    with pytest.raises(ValueError, match="PLANNED and no prepare"):
        coord.finish(coord.plan())
    assert fake_steps == ["plan"]


def test_a_failed_step_is_told_and_raised(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*a: Any, **k: Any) -> Any:
        raise OSError("staging unreachable")

    monkeypatch.setattr(coordinator, "prepare_checkpoint", fail)
    heard = Recorder()
    coord = Coordinator(pipeline, ledger, listeners=[heard])
    planned = coord.plan()
    with pytest.raises(OSError, match="staging unreachable"):
        coord.finish(planned, lambda cid: coord.prepare(cid, stager=None))  # type: ignore[arg-type]
    assert heard.events == [("planned", 1), ("failed prepare", 1)]
    assert ledger.get(pipeline.name, 1).state is CheckpointState.PLANNED


def test_a_failing_listener_never_fails_the_step(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    heard = Recorder()
    coord = Coordinator(pipeline, ledger, listeners=[Broken(), heard])
    with caplog.at_level(logging.WARNING, logger=coordinator.__name__):
        coord.finish(coord.plan(), lambda cid: coord.prepare(cid, stager=None))  # type: ignore[arg-type]
    assert ledger.get(pipeline.name, 1).state is CheckpointState.COMMITTED
    assert heard.events == [("planned", 1), ("prepared", 1), ("committed", 1)]
    assert "listener Broken.planned failed: RuntimeError: listener down" in caplog.text


def test_a_commit_made_elsewhere_is_reported_once_and_only_when_it_moved_the_ledger(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    """``commit_with`` (the commit task's spark-submit): told committed, with a time, when
    the call moved the checkpoint to COMMITTED; not when it was COMMITTED already, nor when
    the call left it PREPARED (the caller says what that means); a raising call is told."""
    heard = Recorder()
    coord = Coordinator(pipeline, ledger, listeners=[heard])
    planned = coord.plan()
    assert planned.checkpoint is not None
    coord.prepare(planned.checkpoint.checkpoint_id, stager=None)  # type: ignore[arg-type]
    cid = planned.checkpoint.checkpoint_id
    heard.events.clear()

    left, _ = coord.commit_with(cid, lambda c: None)  # a job that ended without committing
    assert left.state is CheckpointState.PREPARED and heard.events == []

    def boom(c: int) -> None:
        raise RuntimeError("spark-submit died")

    with pytest.raises(RuntimeError, match="spark-submit died"):
        coord.commit_with(cid, boom)
    assert heard.events == [("failed commit", cid)]

    done, result = coord.commit_with(cid, lambda c: coordinator.commit_checkpoint(pipeline, ledger, c))
    assert result.checkpoint.state is CheckpointState.COMMITTED  # what the call returned
    assert done.state is CheckpointState.COMMITTED
    assert heard.events == [("failed commit", cid), ("committed", cid)]
    coord.commit_with(cid, lambda c: None)  # COMMITTED before the call: not reported again
    assert heard.events == [("failed commit", cid), ("committed", cid)]


# -- every entry point sends the same metrics --------------------------------------------------


def _kinds(sink: RecordingSink) -> set[tuple[str, str]]:
    return {(kind, name) for kind, name, _value, _pipeline in sink.sent}


def test_the_stream_steps_send_the_reference_metrics(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    from airflow_provider_eo.core.stream_steps import default_steps

    sink = RecordingSink()
    steps = default_steps(pipeline, ledger, stager=None, actor=Actor(), metrics=sink)  # type: ignore[arg-type]
    cp = steps.plan_next()
    assert cp is not None
    steps.prepare(cp.checkpoint_id)
    steps.commit(cp.checkpoint_id)
    assert _kinds(sink) == STREAM_METRICS
    assert ("count", CHECKPOINT_RECORDS, 7, "orders") in sink.sent
    assert ("gauge", LAG_RECORDS, 5, "orders") in sink.sent


def test_run_once_sends_the_streams_metrics(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    from airflow_provider_eo.core.runner import run_once

    sink = RecordingSink()
    result = run_once(pipeline, ledger=ledger, stager=None, metrics=sink)  # type: ignore[arg-type]
    assert result.steps == ["plan:1:PLANNED", "prepare:7", "commit:7"]
    assert _kinds(sink) == STREAM_METRICS
    assert ("count", CHECKPOINT_RECORDS, 7, "orders") in sink.sent


@pytest.mark.parametrize("where", ["here", "spark-submit"])
def test_run_backfill_sends_the_streams_metrics(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A prepare in this process is timed here; one elsewhere (the operator's spark-submit)
    is reported by its own driver, so the backfill does not send it a second time."""
    derived = backfill.backfill_pipeline(pipeline, "out-bf")
    ledger.ensure_pipeline(derived.name, derived.fingerprint())
    cp = ledger.plan(derived.name, list(RANGES), commit_plan=names.commit_plan(derived, 1))
    plans: list[CheckpointRecord | None] = [cp, None]
    monkeypatch.setattr(backfill, "plan_backfill", lambda *a, **k: plans.pop(0))

    def submitted(pipeline: Pipeline, ledger: Ledger, cid: int) -> None:  # a spark-submit's work
        ledger.mark_prepared(
            pipeline.name, cid, attempt="a1", staging_location="x", records=7, bytes_=70, shard_counts={0: 7}
        )

    prepare = backfill.local_prepare(stager=None) if where == "here" else submitted  # type: ignore[arg-type]
    sink = RecordingSink()
    result = backfill.run_backfill(
        backfill.BackfillRequest(pipeline, 0, 1, "out-bf"), ledger, prepare=prepare, metrics=sink
    )
    assert result.steps == ("prepare:1", "commit:1:7")
    expected = STREAM_METRICS if where == "here" else STREAM_METRICS - {("seconds", PREPARE_SECONDS)}
    assert _kinds(sink) == expected
    assert {p for *_, p in sink.sent} == {derived.name}


def test_the_sinks_batch_sends_the_streams_metrics(
    tmp_path: Path, fake_steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_eo.spark import frame_stager, offset_log
    from airflow_provider_eo.streaming.sink import KafkaExactlyOnceSink

    metrics = RecordingSink()
    sink = KafkaExactlyOnceSink(
        "orders",
        {"bootstrap.servers": "fake:9092"},
        sink_topic=OUT,
        ledger_url=f"sqlite:///{tmp_path / 'sink.db'}",
        staging_dir=str(tmp_path / "staging"),
        commit_mode="local",
        metrics=metrics,
    )
    monkeypatch.setattr(offset_log, "query_id", lambda spark, location: "q-1")
    monkeypatch.setattr(
        offset_log,
        "batch_offsets",
        lambda spark, location, batch, where: SimpleNamespace(starts={("in", 0): 0}, ends={("in", 0): 10}),
    )
    monkeypatch.setattr(frame_stager, "FrameStager", lambda df: None)
    monkeypatch.setattr(batches, "check_may_plan", lambda pipeline, ledger, **k: None)
    monkeypatch.setattr(admin, "partition_count", lambda config, topic: 1)
    sink._run = SimpleNamespace()  # type: ignore[assignment]  # the query's run: not under test
    frame = SimpleNamespace(sparkSession=None)
    try:
        sink._batch(frame, 0, str(tmp_path / "checkpoint"))  # type: ignore[arg-type]
    finally:
        sink._run = None
        sink.close()
    assert fake_steps == ["prepare", "commit"]
    assert _kinds(metrics) == STREAM_METRICS
    assert ("count", CHECKPOINT_RECORDS, 7, "orders") in metrics.sent


# -- a spark-mode backfill with no shard runner ------------------------------------------------


def test_a_spark_mode_backfill_without_a_runner_commits_here_and_says_so(
    pipeline: Pipeline, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_backfill of a ``commit_mode="spark"`` pipeline given no shard runner (the Airflow
    backfill operator's case) commits in this process, against the fake Kafka, with one line
    saying so; it never fails with "commit_mode 'spark' needs Spark" (ConfigError)."""
    live = dataclasses.replace(pipeline, commit_mode="spark")
    derived = backfill.backfill_pipeline(live, "out-bf")
    broker: FakeBroker = patched_broker(monkeypatch, {"out-bf": 1})
    ledger.ensure_pipeline(derived.name, derived.fingerprint())
    cp = prepared_checkpoint(ledger, derived, {0: [b"x", b"y"]}, sink_partitions=1)
    plans: list[CheckpointRecord | None] = [cp, None]
    monkeypatch.setattr(backfill, "plan_backfill", lambda *a, **k: plans.pop(0))
    lines: list[str] = []
    result = backfill.run_backfill(
        backfill.BackfillRequest(live, 0, 1, "out-bf"),
        ledger,
        prepare=lambda *a: pytest.fail("a PREPARED checkpoint is not prepared again"),
        say=lines.append,
        clients=FakeClients(broker),
    )
    assert result.checkpoints[0].state is CheckpointState.COMMITTED
    assert broker.values("out-bf", 0) == [b"x", b"y"]
    assert len(lines) == 1 and "no Spark shard runner: committing its shards in this process" in lines[0]


def test_the_coordinator_uses_one_runner_for_every_commit(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []
    real = coordinator.commit_checkpoint

    def commit(*a: Any, **kw: Any) -> CommitResult:
        seen.append(kw["runner"])
        return real(*a, **kw)

    monkeypatch.setattr(coordinator, "commit_checkpoint", commit)
    runner = object()
    coord = Coordinator(pipeline, ledger, runner=runner)  # type: ignore[arg-type]
    coord.finish(coord.plan(), lambda cid: coord.prepare(cid, stager=None))  # type: ignore[arg-type]
    coord.commit(1)
    assert seen == [runner, runner]


def test_planned_of_a_source(pipeline: Pipeline, ledger: Ledger) -> None:
    """A range source's answer is the checkpoint with its step."""

    class Fixed:
        def plan(self, pipeline: Pipeline, ledger: Ledger, actor: Actor, clients: Any) -> Planned:
            return Planned.of(None, "nothing waiting")

    assert Coordinator(pipeline, ledger).plan(Fixed()) == Planned(None, "nothing", "nothing waiting")


def test_the_lag_after_a_commit_is_read_through_the_coordinators_clients(
    pipeline: Pipeline, ledger: Ledger, fake_steps: list[str]
) -> None:
    """The metrics listener asks the coordinator's Kafka side for the log ends (the fake
    cluster's ``in[0]`` ends at 40; the patched admin call would answer 15)."""
    broker = FakeBroker(partitions={OUT: SINK_PARTITIONS}, logs={("in", 0): (0, 40)})
    sink = RecordingSink()
    coord = Coordinator(pipeline, ledger, clients=FakeClients(broker), metrics=sink)
    coord.finish(coord.plan(), lambda cid: coord.prepare(cid, stager=None))  # type: ignore[arg-type]
    lag = [value for kind, name, value, _p in sink.sent if name == LAG_RECORDS]
    assert lag == [30]  # 40 - the checkpoint's end (10)
    assert ("", "list_offsets:latest") in broker.calls


class StagesTheRange:
    """A stager that stages one output record per source record of every non-empty range,
    into sink partition 0, as Spark's stager lays it out."""

    def start(self, pipeline: Pipeline) -> None:
        pass

    def stage(self, request: Any) -> Any:
        from eo_fake_kafka import write_staged

        from airflow_provider_eo import staging
        from airflow_provider_eo.core.prepare import RangeRead, StageResult

        live = [r for r in request.ranges if r.end > r.start]
        values = [f"{r.topic}-{r.partition}-{o}".encode() for r in live for o in range(r.start, r.end)]
        write_staged(Path(request.path), 0, values, src_topic="in")
        return StageResult(
            files=staging.describe_attempt(request.path),
            reads=tuple(RangeRead(r, r.end - r.start, 1_000, 2_000) for r in live),
            app_id="app-fake",
            rows_written={0: len(values)},
        )


def test_one_cycle_reads_kafka_only_through_the_clients_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plan, prepare, commit and the lag read of one checkpoint, each step real, against the
    fake cluster the coordinator was built with: no step builds Kafka clients of its own
    (the clients are built once per pipeline and handed on)."""
    from airflow_provider_eo.core import kafka_clients

    def built(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a step built its own Kafka clients")

    monkeypatch.setattr(kafka_clients.RealKafka, "__init__", built)
    pipeline = fake_pipeline(tmp_path, sink=OUT, shards=SHARDS)
    broker = FakeBroker(partitions={"in": 1, OUT: SINK_PARTITIONS}, logs={("in", 0): (0, 12)})
    sink = RecordingSink()
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        coord = Coordinator(pipeline, ledger, clients=FakeClients(broker), metrics=sink)
        result = coord.finish(coord.plan(), lambda cid: coord.prepare(cid, StagesTheRange()))  # type: ignore[arg-type]
        assert result is not None and result.checkpoint.state is CheckpointState.COMMITTED
        assert coord.finish(coord.plan()) is None  # nothing new
    published = [r.value for r in broker.committed if r.topic == OUT]
    assert published == [f"in-0-{o}".encode() for o in range(12)]
    assert [value for _k, name, value, _p in sink.sent if name == LAG_RECORDS] == [0]
