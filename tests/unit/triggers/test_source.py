"""The source watcher: its decision (pure), and the trigger against a real SQLite ledger with
Kafka's offsets faked (what fires, what a restarted trigger does, what two copies do)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.triggers import source
from airflow_provider_eo.triggers.source import EoSourceRecordsTrigger, decide_source_fire, positions
from airflow_provider_eo.version_compat import BaseEventTrigger

A, B = ("in", 0), ("in", 1)


def decide(
    source_ends: dict[Any, int],
    planned: dict[Any, int | None],
    fired: dict[Any, int | None] | None = None,
    age: float | None = None,
    **kw: Any,
) -> source.SourceDecision:
    return decide_source_fire(
        source_ends=source_ends,
        planned_ends=planned,
        fired_planned=None if fired is None else positions(fired),
        fired_age_s=age,
        refire_after=kw.pop("refire_after", 60.0),
        **kw,
    )


def test_an_idle_source_never_fires() -> None:
    assert not decide({A: 5, B: 0}, {A: 5, B: 0}).fire
    # Long after the last firing too: nothing waits, so nothing refires.
    assert not decide({A: 5}, {A: 5}, fired={A: 0}, age=1e6).fire


def test_records_beyond_the_planned_end_fire_once_until_a_plan_moves_it() -> None:
    first = decide({A: 7, B: 0}, {A: 5, B: 0})
    assert first.fire and first.pending == [A]
    # Fired at planned {A: 5}: more records arrive, the run has not planned yet.
    assert not decide({A: 9, B: 3}, {A: 5, B: 0}, fired={A: 5, B: 0}, age=5).fire
    # The run planned up to 7 (it saw less than is there now): what remains fires again.
    again = decide({A: 9, B: 3}, {A: 7, B: 0}, fired={A: 5, B: 0}, age=5)
    assert again.fire and again.pending == [A, B] and "planned since" in again.reason
    # It planned everything: silent.
    assert not decide({A: 9, B: 3}, {A: 9, B: 3}, fired={A: 5, B: 0}, age=5).fire


def test_the_source_end_is_compared_strictly() -> None:
    """A planned end equal to the source end is nothing to do (the plan would find nothing)."""
    assert not decide({A: 5}, {A: 5}).fire
    assert decide({A: 6}, {A: 5}).fire


def test_no_plan_for_refire_after_fires_again() -> None:
    assert not decide({A: 7}, {A: 5}, fired={A: 5}, age=59.9).fire
    late = decide({A: 7}, {A: 5}, fired={A: 5}, age=60.0)
    assert late.fire and "refire_after=60s" in late.reason


def test_an_unfinished_checkpoint_without_records_fires_only_after_refire_after() -> None:
    """A run that failed after planning: nothing beyond the planned end, but its checkpoint
    waits for a run that resumes it."""
    assert decide({A: 5}, {A: 5}, unfinished=True).fire  # never fired (e.g. a new watcher)
    # The run of the last event is working on it (planned since): left alone ...
    assert not decide({A: 5}, {A: 5}, fired={A: 0}, age=59, unfinished=True).fire
    # ... until refire_after without another event.
    assert decide({A: 5}, {A: 5}, fired={A: 0}, age=60, unfinished=True).fire


def test_a_partition_without_a_pinned_start_fires_and_a_stopped_pipeline_never_does() -> None:
    unpinned = decide({A: 0}, {A: None})
    assert unpinned.fire and unpinned.pending == [A]
    # A partition the ledger starts to know (the topic grew) changes the planned position.
    assert decide({A: 5, B: 2}, {A: 5, B: 0}, fired={A: 5}, age=1).fire
    assert not decide({A: 9}, {A: 5}, stopped=True).fire


@pytest.fixture()
def offsets(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, int], int]:
    """The source's last stable offsets the trigger reads (Kafka faked): set them in the test."""
    ends: dict[tuple[str, int], int] = {A: 0, B: 0}

    def read(pipeline: Any, *, known: Any) -> tuple[dict[Any, int], dict[Any, int | None]]:
        planned = {tp: known.get(tp, 0) for tp in ends}  # earliest startup: log start 0
        return dict(ends), planned

    monkeypatch.setattr(source, "read_source_ends", read)
    return ends


def test_trigger_fires_once_per_planned_position_across_restarts_and_copies(
    pipeline_ref: str, offsets: dict[tuple[str, int], int]
) -> None:
    trigger = EoSourceRecordsTrigger(pipeline=pipeline_ref, poll_interval=0.01, refire_after=3600)
    assert isinstance(trigger, BaseEventTrigger)
    cls, kwargs = trigger.serialize()
    assert EoSourceRecordsTrigger(**kwargs).serialize() == (cls, kwargs)
    pipeline = load_pipeline(pipeline_ref)
    assert trigger.poll(pipeline) is None  # idle

    offsets[A] = 7
    event = trigger.poll(pipeline)
    assert event is not None
    assert event.payload == {
        "status": "source_records",
        "pipeline": "orders",
        "fire": 1,
        "reason": "records beyond the planned position",
        "partitions": [
            {"topic": "in", "partition": 0, "source_end": 7, "planned_end": 0},
            {"topic": "in", "partition": 1, "source_end": 0, "planned_end": 0},
        ],
        "pending": 7,
    }
    offsets[B] = 4  # produced before the run plans
    assert trigger.poll(pipeline) is None
    # A restarted triggerer builds the trigger again from its kwargs: it remembers nothing,
    # the ledger's mark does.
    restarted = EoSourceRecordsTrigger(**kwargs)
    assert restarted.poll(pipeline) is None

    # The run plans a capped checkpoint: [0, 5) of partition 0 and all of partition 1.
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline("orders", pipeline.fingerprint())
        ledger.plan("orders", [RangeSpec("in", 0, 0, 5), RangeSpec("in", 1, 0, 4)])
    again = restarted.poll(pipeline)
    assert again is not None and again.payload["fire"] == 2 and again.payload["pending"] == 2
    assert trigger.poll(pipeline) is None  # the other copy does not fire for it too

    # Two copies deciding on the same mark: the compare-and-set lets one of them fire.
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.plan("orders", [RangeSpec("in", 0, 5, 6), RangeSpec("in", 1, 4, 4)], max_pending=2)
    mark = source.watch_ledger(pipeline.ledger_url).get_watch_mark("orders", source.SOURCE_WATCH)
    assert source.watch_ledger(pipeline.ledger_url).claim_watch_mark(
        "orders", source.SOURCE_WATCH, seq=mark.seq, state={"planned": []}
    )
    assert trigger.poll(pipeline) is not None  # it read the mark the other copy wrote
    late = source.watch_ledger(pipeline.ledger_url).claim_watch_mark(
        "orders", source.SOURCE_WATCH, seq=mark.seq, state={"planned": []}
    )
    assert late is False


def test_trigger_refires_after_refire_after_without_a_plan(
    pipeline_ref: str, offsets: dict[tuple[str, int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = EoSourceRecordsTrigger(pipeline=pipeline_ref, refire_after=30)
    pipeline = load_pipeline(pipeline_ref)
    offsets[A] = 3
    assert trigger.poll(pipeline) is not None
    assert trigger.poll(pipeline) is None
    real = source.watch_ledger(pipeline.ledger_url).get_watch_mark

    def aged(name: str, watch: str) -> Any:
        import dataclasses

        return dataclasses.replace(real(name, watch), age_s=31.0)

    monkeypatch.setattr(source.watch_ledger(pipeline.ledger_url), "get_watch_mark", aged)
    event = trigger.poll(pipeline)
    assert event is not None and event.payload["fire"] == 2 and "no plan in 31s" in event.payload["reason"]


def test_run_keeps_polling_after_an_event_and_survives_a_failing_read(
    pipeline_ref: str, offsets: dict[tuple[str, int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_eo.errors import KafkaAdminError

    trigger = EoSourceRecordsTrigger(pipeline=pipeline_ref, poll_interval=0.01)
    offsets[A] = 2
    real_poll = trigger.poll
    calls = {"n": 0}

    def flaky(pipeline: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KafkaAdminError("broker down")
        return real_poll(pipeline)

    monkeypatch.setattr(trigger, "poll", flaky)

    async def scenario() -> list[Any]:
        gen = trigger.run()
        first = await asyncio.wait_for(gen.__anext__(), 10)
        pending = asyncio.ensure_future(gen.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.2)
        assert not done  # no second event for the same data
        with Ledger(load_pipeline(pipeline_ref).ledger_url) as ledger:
            ledger.ensure_pipeline("orders", "fp")
            ledger.plan("orders", [RangeSpec("in", 0, 0, 1), RangeSpec("in", 1, 0, 0)])
        second = await asyncio.wait_for(pending, 10)
        await gen.aclose()
        return [first.payload, second.payload]

    first, second = asyncio.run(scenario())
    assert calls["n"] > 2 and (first["fire"], second["fire"]) == (1, 2)


def test_the_kwargs_name_the_pipeline_by_reference() -> None:
    with pytest.raises(ValueError, match="'module:ATTR'"):
        EoSourceRecordsTrigger(pipeline="orders")
    with pytest.raises(ValueError, match="positive"):
        EoSourceRecordsTrigger(pipeline="m:P", refire_after=0)
