"""EoPreparedCheckpointTrigger (the AssetWatcher's trigger) against a real SQLite ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.triggers.stream import EoPreparedCheckpointTrigger, read_prepared
from airflow_provider_eo.version_compat import BaseEventTrigger

PIPELINE = "orders"


def _prepare(ledger: Ledger, cid: int) -> None:
    ledger.mark_prepared(
        PIPELINE, cid, attempt="a", staging_location="/x", records=1, bytes_=1, shard_counts={0: 1}
    )


def test_fires_once_per_prepared_checkpoint_lowest_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger(url) as ledger:
        ledger.ensure_pipeline(PIPELINE, "fp")
    trigger = EoPreparedCheckpointTrigger(pipeline=PIPELINE, ledger_url=url, poll_interval=0.02)
    assert isinstance(trigger, BaseEventTrigger)
    cls, kwargs = trigger.serialize()
    assert EoPreparedCheckpointTrigger(**kwargs).serialize() == (cls, kwargs)
    assert read_prepared(url, "unknown") == []

    async def scenario() -> list[Any]:
        gen = trigger.run()
        events: list[Any] = []
        with Ledger(url) as ledger:
            for n in range(3):
                ledger.plan(PIPELINE, [RangeSpec("in", 0, n * 10, n * 10 + 10)], max_pending=3)
            _prepare(ledger, 2)
            _prepare(ledger, 1)
        events.append((await asyncio.wait_for(gen.__anext__(), 10)).payload)
        events.append((await asyncio.wait_for(gen.__anext__(), 10)).payload)
        # Nothing new: the trigger keeps polling without firing checkpoints 1 and 2 again.
        pending = asyncio.ensure_future(gen.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.3)
        assert not done
        with Ledger(url) as ledger:
            _prepare(ledger, 3)
        events.append((await asyncio.wait_for(pending, 10)).payload)
        await gen.aclose()
        return events

    events = asyncio.run(scenario())
    assert [e["checkpoint_id"] for e in events] == [1, 2, 3]
    assert all(
        e == {"status": "prepared", "pipeline": PIPELINE, "checkpoint_id": e["checkpoint_id"]} for e in events
    )


def test_stream_run_event_for_every_state() -> None:
    from airflow_provider_eo.triggers.stream import stream_run_event

    run = {"state": "RUNNING", "heartbeat_s": 1.0, "heartbeat_age_s": 0.5, "reason": ""}
    assert stream_run_event(run, waited_s=999, startup_timeout=10) is None
    lost = stream_run_event({**run, "heartbeat_age_s": 4.5}, waited_s=0, startup_timeout=10)
    assert lost is not None and lost["status"] == "lost" and "no heartbeat for 4s" in lost["reason"]
    ended = stream_run_event(
        {**run, "state": "ENDED", "reason": "checkpoints"}, waited_s=0, startup_timeout=1
    )
    assert ended == {
        "status": "success",
        "reason": "checkpoints",
        "run": {**run, "state": "ENDED", "reason": "checkpoints"},
    }
    for state in ("FAILED", "LOST"):
        event = stream_run_event({**run, "state": state, "reason": "boom"}, waited_s=0, startup_timeout=1)
        assert event is not None and event["status"] == "failed" and event["reason"] == "boom"
    assert stream_run_event(None, waited_s=5, startup_timeout=10) is None
    never = stream_run_event(None, waited_s=11, startup_timeout=10)
    assert (
        never is not None
        and never["status"] == "failed"
        and "did not register its run within 10s" in never["reason"]
    )


def test_stream_run_trigger_fires_when_the_run_ends_and_on_kill_asks_it_to_stop(tmp_path: Path) -> None:
    from airflow_provider_eo.triggers.stream import EoStreamRunTrigger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Ledger(url) as ledger:
        ledger.ensure_pipeline(PIPELINE, "fp")
    trigger = EoStreamRunTrigger(pipeline=PIPELINE, run_id="r1", ledger_url=url, poll_interval=0.02)
    cls, kwargs = trigger.serialize()
    assert EoStreamRunTrigger(**kwargs).serialize() == (cls, kwargs)

    async def scenario() -> Any:
        gen = trigger.run()
        pending = asyncio.ensure_future(gen.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.3)
        assert not done  # not registered yet, within the startup timeout: keeps polling
        with Ledger(url) as ledger:
            ledger.register_stream_run(
                PIPELINE, run_id="r1", host="h", pid=1, commit_mode="inline", heartbeat_s=30.0
            )
        done, _ = await asyncio.wait({pending}, timeout=0.3)
        assert not done  # running, beating: keeps polling
        await trigger.on_kill()  # the waiting task was marked failed: ask the run to stop
        with Ledger(url) as ledger:
            assert (
                ledger.heartbeat_stream_run("r1").stop_requested_by == "airflow: the waiting task was stopped"
            )
            ledger.end_stream_run("r1", state="ENDED", reason="stop requested", summary={"checkpoints": 1})
        event = await asyncio.wait_for(pending, 10)
        await gen.aclose()
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "success" and payload["run_id"] == "r1" and payload["pipeline"] == PIPELINE
    assert payload["run"]["summary"] == {"checkpoints": 1}


def test_stream_run_trigger_gives_up_on_a_ledger_gone_for_longer_than_the_startup_timeout(
    tmp_path: Path,
) -> None:
    from airflow_provider_eo.triggers.stream import EoStreamRunTrigger

    missing = f"sqlite:///{tmp_path / 'gone.db'}"  # read-only open of a ledger that is not there
    trigger = EoStreamRunTrigger(
        pipeline=PIPELINE, run_id="r1", ledger_url=missing, poll_interval=0.05, startup_timeout=0.3
    )

    async def first() -> Any:
        gen = trigger.run()
        event = await asyncio.wait_for(gen.__anext__(), 10)
        await gen.aclose()
        return event.payload

    payload = asyncio.run(first())
    assert payload["status"] == "failed" and "the ledger could not be read for" in payload["reason"]


def _commit(ledger: Ledger, pipeline: str, start: int, actor: Any) -> int:
    cid = ledger.plan(pipeline, [RangeSpec("in", 0, start, start + 10)]).checkpoint_id
    ledger.mark_prepared(
        pipeline, cid, attempt="a", staging_location="/x", records=10, bytes_=1, shard_counts={0: 10}
    )
    ledger.mark_committed(pipeline, cid, actor=actor)
    return cid


def test_announcement_steps_announce_stream_commits_and_pass_over_the_rest() -> None:
    import datetime as dt

    from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState
    from airflow_provider_eo.ledger.watches import StreamCommitter
    from airflow_provider_eo.triggers.stream import announcement_steps

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def cp(cid: int, state: CheckpointState, dag: str | None, minute: int = 1) -> CheckpointRecord:
        return CheckpointRecord(
            pipeline="p",
            checkpoint_id=cid,
            state=state,
            lineage=1,
            ranges=[],
            planned_at=t0,
            committed_at=t0 + dt.timedelta(minutes=minute) if state is CheckpointState.COMMITTED else None,
            dag_id=dag,
            task_id=None if dag is None else ("stream" if dag == "eo_stream" else "eo.commit"),
        )

    C, A, P = CheckpointState.COMMITTED, CheckpointState.ABORTED, CheckpointState.PREPARED
    stream = StreamCommitter("r1", "eo_stream", "stream", t0, None)
    cli = StreamCommitter("r2", None, None, t0 + dt.timedelta(minutes=10), t0 + dt.timedelta(minutes=20))
    cps = [
        cp(1, C, "eo_stream"),
        cp(2, C, "eo_pipeline"),  # a commit task's: it announces it itself
        cp(3, A, None),
        cp(4, C, None, minute=15),  # committed by the CLI stream run r2
        cp(5, C, None, minute=25),  # by a CLI commit after r2 ended
        cp(6, P, "eo_stream"),  # not committed yet: the walk stops
        cp(7, C, "eo_stream"),
    ]
    steps = announcement_steps(cps, [stream, cli])
    assert [(through, c.checkpoint_id if c else None) for through, c in steps] == [
        (1, 1),
        (3, None),
        (4, 4),
        (5, None),
    ]
    assert announcement_steps(cps, []) == [(5, None)]


def test_stream_commits_trigger_announces_each_stream_checkpoint_once_across_restarts(
    pipeline_ref: str,
) -> None:
    from airflow_provider_eo.assets import checkpoint_extra
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.pipeline import load_pipeline
    from airflow_provider_eo.triggers.stream import EoStreamCommitsTrigger

    pipeline = load_pipeline(pipeline_ref)
    trigger = EoStreamCommitsTrigger(pipeline=pipeline_ref, poll_interval=0.01)
    assert isinstance(trigger, BaseEventTrigger)
    cls, kwargs = trigger.serialize()
    assert EoStreamCommitsTrigger(**kwargs).serialize() == (cls, kwargs)
    stream = Actor(dag_id="eo_stream", run_id="manual__1", task_id="stream", try_number=1)
    task = Actor(dag_id="eo_pipeline", run_id="scheduled__1", task_id="eo.commit", try_number=1)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline("orders", pipeline.fingerprint())
        _commit(ledger, "orders", 0, task)  # history: never announced
        assert trigger.poll(pipeline) == []  # the first poll sets the mark after it
        ledger.register_stream_run(
            "orders",
            run_id="r1",
            host="h",
            pid=1,
            commit_mode="inline",
            heartbeat_s=5,
            dag_id="eo_stream",
            task_id="stream",
        )
        two = _commit(ledger, "orders", 10, stream)
        _commit(ledger, "orders", 20, task)
        four = _commit(ledger, "orders", 30, stream)
        payloads = trigger.poll(pipeline)  # one per poll: one claimed event in flight
        assert payloads == [checkpoint_extra(pipeline, ledger.get("orders", two))]
        assert [p["checkpoint_id"] for p in trigger.poll(pipeline)] == [four]
        assert trigger.poll(pipeline) == []
        # Down while the stream commits; a restarted trigger announces it, once.
        five = _commit(ledger, "orders", 40, stream)
    restarted = EoStreamCommitsTrigger(**kwargs)
    assert [p["checkpoint_id"] for p in restarted.poll(pipeline)] == [five]
    assert restarted.poll(pipeline) == [] and trigger.poll(pipeline) == []


def test_stream_commits_trigger_run_yields_the_payloads(pipeline_ref: str) -> None:
    from airflow_provider_eo.ledger import Actor
    from airflow_provider_eo.pipeline import load_pipeline
    from airflow_provider_eo.triggers.stream import EoStreamCommitsTrigger

    pipeline = load_pipeline(pipeline_ref)
    stream = Actor(dag_id="eo_stream", run_id="manual__1", task_id="stream", try_number=1)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline("orders", pipeline.fingerprint())
        ledger.register_stream_run(
            "orders",
            run_id="r1",
            host="h",
            pid=1,
            commit_mode="inline",
            heartbeat_s=5,
            dag_id="eo_stream",
            task_id="stream",
        )
    trigger = EoStreamCommitsTrigger(pipeline=pipeline_ref, poll_interval=0.01)

    async def scenario() -> Any:
        gen = trigger.run()
        pending = asyncio.ensure_future(gen.__anext__())
        done, _ = await asyncio.wait({pending}, timeout=0.2)
        assert not done
        with Ledger(pipeline.ledger_url) as ledger:
            _commit(ledger, "orders", 0, stream)
        event = await asyncio.wait_for(pending, 10)
        await gen.aclose()
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["checkpoint_id"] == 1 and payload["lineage"]["dag_id"] == "eo_stream"
