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
