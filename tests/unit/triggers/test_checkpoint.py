"""EoCheckpointTrigger against a real SQLite ledger file."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.triggers.checkpoint import (
    MISSING,
    EoCheckpointTrigger,
    EoCommittedAfterTrigger,
    read_checkpoint_state,
)
from airflow_provider_eo.triggers.stream import EoPreparedCheckpointTrigger

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

PIPELINE = "orders"


@pytest.fixture()
def ledger_url(make_ledger: LedgerFactory) -> str:
    """A ledger with one PLANNED checkpoint of ``orders``, closed: the triggers open their own."""
    url = make_ledger.url()
    with Ledger(url, create=False) as ledger:
        ledger.ensure_pipeline(PIPELINE, "fp")
        ledger.plan(PIPELINE, [RangeSpec("in", 0, 0, 10)])
    return url


def _prepare(url: str, checkpoint_id: int = 1) -> None:
    with Ledger(url) as ledger:
        ledger.mark_prepared(
            PIPELINE,
            checkpoint_id,
            attempt="a1",
            staging_location="/tmp/x",
            records=10,
            bytes_=100,
            shard_counts={0: 10},
        )


def _first_event(trigger: EoCheckpointTrigger, timeout_s: float = 20) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        gen = trigger.run()
        event = await asyncio.wait_for(gen.__anext__(), timeout_s)
        await gen.aclose()
        payload: dict[str, Any] = event.payload
        return payload

    return asyncio.run(first())


def test_serialize_round_trip(ledger_url: str) -> None:
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE, checkpoint_id=3, ledger_url=ledger_url, poll_interval=2.5, deadline=123.0
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_eo.triggers.checkpoint.EoCheckpointTrigger"
    again = EoCheckpointTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {
        "pipeline": PIPELINE,
        "checkpoint_id": 3,
        "ledger_url": ledger_url,
        "ledger_conn_id": None,
        "poll_interval": 2.5,
        "deadline": 123.0,
        "wait_for": "prepared",
        "echo": None,
        "launch_id": None,
    }


def test_a_url_with_a_password_is_refused_a_connection_id_is_resolved_in_the_triggerer(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-pw"
    for trigger_class, extra in (
        (EoCheckpointTrigger, {"checkpoint_id": 1}),
        (EoCommittedAfterTrigger, {"committed_after": "2026-01-01T00:00:00"}),
        (EoPreparedCheckpointTrigger, {}),
    ):
        with pytest.raises(ValueError, match="carries a password, which a trigger must not store"):
            trigger_class(pipeline=PIPELINE, ledger_url=f"postgresql+psycopg://eo:{secret}@db/eo", **extra)
        with pytest.raises(ValueError, match="exactly one of ledger_url and ledger_conn_id"):
            trigger_class(pipeline=PIPELINE, ledger_url=ledger_url, ledger_conn_id="x", **extra)

    # The connection (here with a password the SQLite URL ignores) is looked up where the
    # trigger runs; the stored kwargs hold only its id.
    path = ledger_url.removeprefix("sqlite:///")
    fields = {"conn_type": "eo_ledger", "host": path, "password": secret}
    monkeypatch.setenv("AIRFLOW_CONN_EO_TRIGGER_LEDGER", json.dumps(fields))
    _prepare(ledger_url)
    trigger = EoCheckpointTrigger(pipeline=PIPELINE, checkpoint_id=1, ledger_conn_id="eo_trigger_ledger")
    _classpath, kwargs = trigger.serialize()
    assert kwargs["ledger_conn_id"] == "eo_trigger_ledger" and kwargs["ledger_url"] is None
    assert secret not in json.dumps(kwargs)
    assert _first_event(trigger)["state"] == "PREPARED"


def test_prepared_yields_success(ledger_url: str) -> None:
    _prepare(ledger_url)
    trigger = EoCheckpointTrigger(pipeline=PIPELINE, checkpoint_id=1, ledger_url=ledger_url)
    assert _first_event(trigger) == {
        "status": "success",
        "pipeline": PIPELINE,
        "checkpoint_id": 1,
        "state": "PREPARED",
    }


def test_waits_while_planned_then_succeeds(ledger_url: str) -> None:
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE, checkpoint_id=1, ledger_url=ledger_url, poll_interval=0.05
    )

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(trigger.run().__anext__())
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done  # still PLANNED: no event within several polls
        await asyncio.to_thread(_prepare, ledger_url)
        event = await asyncio.wait_for(task, 20)
        payload: dict[str, Any] = event.payload
        return payload

    assert asyncio.run(scenario())["status"] == "success"


def test_aborted_yields_failed_with_reason(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        ledger.abort(PIPELINE, 1, reason="staging lost")
    event = _first_event(EoCheckpointTrigger(pipeline=PIPELINE, checkpoint_id=1, ledger_url=ledger_url))
    assert event["status"] == "failed" and event["state"] == "ABORTED"
    assert "staging lost" in event["reason"]
    assert event["pipeline"] == PIPELINE and event["checkpoint_id"] == 1


def test_unknown_checkpoint_yields_failed(ledger_url: str) -> None:
    event = _first_event(EoCheckpointTrigger(pipeline=PIPELINE, checkpoint_id=9, ledger_url=ledger_url))
    assert event["status"] == "failed" and event["state"] == "MISSING"


def test_deadline_yields_timeout(ledger_url: str) -> None:
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE,
        checkpoint_id=1,
        ledger_url=ledger_url,
        poll_interval=0.05,
        deadline=time.time() + 0.2,
    )
    event = _first_event(trigger)
    assert event["status"] == "timeout" and event["state"] == "PLANNED"
    assert event["checkpoint_id"] == 1


def test_a_detached_prepare_that_ended_unprepared_fails_the_wait_at_once(ledger_url: str) -> None:
    from airflow_provider_eo.detach import settle_prepare

    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE,
        checkpoint_id=1,
        ledger_url=ledger_url,
        poll_interval=0.05,
        deadline=time.time() + 60,
        launch_id="prepare-1-new",
    )
    # Another launch's failure (an earlier try's) is not this wait's.
    assert "recorded" in settle_prepare(
        ledger_url, PIPELINE, 1, "prepare-1-old", failure="RuntimeError: old", log_path="/tmp/old.log"
    )

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(trigger.run().__anext__())
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done  # still PLANNED and this launch has not ended: waiting
        await asyncio.to_thread(
            settle_prepare,
            ledger_url,
            PIPELINE,
            1,
            "prepare-1-new",
            failure="AirflowException: Cannot execute: spark-submit ... Error code is: 1.",
            log_path="/tmp/eo-prepare/orders-prepare-1-new.log",
        )
        payload: dict[str, Any] = (await asyncio.wait_for(task, 5)).payload
        return payload

    started = time.monotonic()
    event = asyncio.run(scenario())
    assert time.monotonic() - started < 5  # at once, not at the 60 s deadline
    assert event["status"] == "failed" and event["state"] == "PLANNED", event
    assert "Error code is: 1" in event["reason"] and "orders-prepare-1-new.log" in event["reason"]
    assert "old" not in event["reason"]


def test_settling_a_prepared_checkpoint_records_nothing(ledger_url: str) -> None:
    from airflow_provider_eo.detach import settle_prepare
    from airflow_provider_eo.ledger.events import PREPARE_LAUNCH_FAILED

    _prepare(ledger_url)
    # spark-submit failed after the driver prepared (e.g. at shutdown): the checkpoint counts.
    said = settle_prepare(ledger_url, PIPELINE, 1, "l1", failure="boom", log_path="/tmp/l1.log")
    assert said == "checkpoint 1 is PREPARED"
    with Ledger(ledger_url) as ledger:
        assert not [e for e in ledger.events(PIPELINE, 1) if e.kind == PREPARE_LAUNCH_FAILED]
    trigger = EoCheckpointTrigger(pipeline=PIPELINE, checkpoint_id=1, ledger_url=ledger_url, launch_id="l1")
    assert _first_event(trigger)["status"] == "success"


def test_unreachable_ledger_keeps_polling_until_deadline(tmp_path: Path) -> None:
    """A ledger that cannot be read is retried (logged), then the deadline ends the wait."""
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE,
        checkpoint_id=1,
        ledger_url=f"sqlite:///{tmp_path / 'no-such-dir' / 'ledger.db'}",
        poll_interval=0.05,
        deadline=time.time() + 0.3,
    )
    event = _first_event(trigger)
    assert event["status"] == "timeout" and event["state"] == "UNKNOWN"


def test_read_checkpoint_state_is_the_one_read_of_sensor_and_trigger(ledger_url: str) -> None:
    assert read_checkpoint_state(ledger_url, PIPELINE, 1) == ("PLANNED", None)
    state, reason = read_checkpoint_state(ledger_url, PIPELINE, 99)
    assert state == MISSING and reason and "99" in reason
    _prepare(ledger_url)
    assert read_checkpoint_state(ledger_url, PIPELINE, 1) == ("PREPARED", None)
    with Ledger(ledger_url) as ledger:
        ledger.abort(PIPELINE, 1, reason="staging lost")
    assert read_checkpoint_state(ledger_url, PIPELINE, 1) == ("ABORTED", "staging lost")


def test_sensor_uses_the_shared_read() -> None:
    from airflow_provider_eo.sensors import checkpoint as sensor_module

    assert sensor_module.read_checkpoint_state is read_checkpoint_state


def _commit(url: str, checkpoint_id: int = 1) -> None:
    with Ledger(url) as ledger:
        ledger.mark_committed(PIPELINE, checkpoint_id)


def test_wait_for_committed_ignores_prepared(ledger_url: str) -> None:
    from airflow_provider_eo.triggers.checkpoint import done_states

    _prepare(ledger_url)
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE,
        checkpoint_id=1,
        ledger_url=ledger_url,
        poll_interval=0.05,
        deadline=time.time() + 0.3,
        wait_for="committed",
    )
    assert trigger.serialize()[1]["wait_for"] == "committed"
    assert _first_event(trigger)["status"] == "timeout"  # PREPARED is not enough
    _commit(ledger_url)
    trigger = EoCheckpointTrigger(
        pipeline=PIPELINE, checkpoint_id=1, ledger_url=ledger_url, wait_for="committed"
    )
    assert _first_event(trigger)["state"] == "COMMITTED"
    with pytest.raises(ValueError, match="wait_for"):
        done_states("published")


def test_committed_after(ledger_url: str) -> None:
    import datetime as dt

    from airflow_provider_eo.triggers.checkpoint import EoCommittedAfterTrigger, read_committed_after

    before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    assert read_committed_after(ledger_url, PIPELINE, before) is None  # nothing committed
    assert read_committed_after(ledger_url, "unknown", before) is None  # pipeline not registered yet
    _prepare(ledger_url)
    _commit(ledger_url)
    found = read_committed_after(ledger_url, PIPELINE, before)
    assert found is not None and found[0] == 1
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
    assert read_committed_after(ledger_url, PIPELINE, later) is None  # committed before T
    naive = before.replace(tzinfo=None).isoformat()  # naive means UTC
    trigger = EoCommittedAfterTrigger(pipeline=PIPELINE, committed_after=naive, ledger_url=ledger_url)
    cls, kwargs = trigger.serialize()
    assert cls.endswith("EoCommittedAfterTrigger") and EoCommittedAfterTrigger(**kwargs).serialize() == (
        cls,
        kwargs,
    )
    event = _first_event(trigger)
    assert event["status"] == "success" and event["checkpoint_id"] == 1
    late = EoCommittedAfterTrigger(
        pipeline=PIPELINE,
        committed_after=later.isoformat(),
        ledger_url=ledger_url,
        poll_interval=0.05,
        deadline=time.time() + 0.3,
    )
    assert _first_event(late)["status"] == "timeout"


def test_polls_share_one_ledger_engine_per_process(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watcher polling every 2 s must not build (and dispose) an engine per poll."""
    from airflow_provider_eo.ledger import store
    from airflow_provider_eo.triggers import checkpoint as trig

    trig.close_ledger_readers()
    built: list[str] = []
    real_init = store.Ledger.__init__

    def counting_init(self: Any, url: str, *, create: bool = True) -> None:
        built.append(url)
        real_init(self, url, create=create)

    monkeypatch.setattr(store.Ledger, "__init__", counting_init)
    for _ in range(50):
        assert read_checkpoint_state(ledger_url, PIPELINE, 1)[0] == "PLANNED"
        trig.read_committed_after(ledger_url, PIPELINE, dt.datetime.now(dt.timezone.utc))
    assert built == [ledger_url]
    trig.close_ledger_readers()
    read_checkpoint_state(ledger_url, PIPELINE, 1)
    assert built == [ledger_url, ledger_url]
