"""The scheduled backfill DAG over records with explicit timestamps spanning three days:
each daily run re-processes exactly its own data interval into the backfill sink, once;
running an interval again adds nothing. Real Airflow 3 (``dag.test()`` per logical date,
the DAG's data-interval timetable), Kafka and spark-submit."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger

from .conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(900)]

DAY1 = datetime(2025, 1, 1, tzinfo=timezone.utc)
PER_DAY = 4


def _produce_three_days(bootstrap: str, topic: str) -> dict[int, int]:
    """PER_DAY records a day on DAY1..DAY3 (Kafka timestamps set explicitly); returns
    {amount: day index}, each record's ``amount`` being unique."""
    producer = Producer({"bootstrap.servers": bootstrap})
    day_of: dict[int, int] = {}
    for day in range(3):
        for i in range(PER_DAY):
            amount = day * PER_DAY + i
            at = DAY1 + timedelta(days=day, hours=1 + 5 * i)
            event = {"batch": day, "seq": i, "user": f"user-{amount}", "amount": amount}
            producer.produce(
                topic,
                key=f"user-{amount}",
                value=json.dumps(event),
                partition=amount % 3,
                timestamp=int(at.timestamp() * 1000),
            )
            day_of[amount] = day
    assert producer.flush(30) == 0
    return day_of


def test_daily_runs_backfill_their_interval_once(
    airflow_env: Any, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_backfill.py")
    # Records from 2025: time retention would delete them at once, so keep them forever.
    keep = {"retention.ms": "-1"}
    sink = make_topic("af-backfill", 3, **keep)
    airflow_env.env.update(
        {
            "EO_DEMO_SOURCE_TOPIC": make_topic("af-src-old", 3, **keep),
            "EO_DEMO_SINK_TOPIC": make_topic("af-sink-old", 3, **keep),
            "EO_BACKFILL_SINK_TOPIC": sink,
        }
    )
    pipeline = airflow_env.pipeline()
    day_of = _produce_three_days(kafka_bootstrap, pipeline.source_topics[0])

    # The live pipeline commits all three days (one checkpoint).
    (live,) = airflow_env.run_dag_test("eo_pipeline")
    assert live["xcoms"]["eo.commit"]["state"] == "COMMITTED", live
    assert live["xcoms"]["eo.commit"]["records"] == 3 * PER_DAY

    # Runs for day 1 and day 2 (logical date = end of the interval), then day 1 again.
    dates = [DAY1 + timedelta(days=1), DAY1 + timedelta(days=2), DAY1 + timedelta(days=1)]
    runs = airflow_env.run_dag_test("eo_backfill", logical_dates=",".join(d.isoformat() for d in dates))

    assert [r["state"] for r in runs] == ["success"] * 3, runs
    out = [r["xcoms"]["backfill"] for r in runs]
    day2 = DAY1 + timedelta(days=1)
    assert [o["start"] for o in out] == [DAY1.isoformat(), day2.isoformat(), DAY1.isoformat()], out
    assert [o["records"] for o in out] == [PER_DAY, PER_DAY, 0], out
    assert not out[2]["checkpoints"], out[2]  # nothing left to do: no checkpoint, no Spark job
    assert out[0]["backfill_pipeline"] == out[1]["backfill_pipeline"] != pipeline.name

    # The backfill sink holds exactly the records of days 1 and 2, once each.
    records = read_sink({"bootstrap.servers": kafka_bootstrap}, sink)
    amounts = Counter(json.loads(m.value())["amount"] for m in records)
    expected = {a for a, day in day_of.items() if day in (0, 1)}
    assert set(amounts) == expected and set(amounts.values()) == {1}, amounts
    # The live sink was not touched by the backfill: still one copy of each record.
    live_amounts = Counter(
        json.loads(m.value())["amount"] for m in read_sink(pipeline.kafka, pipeline.sink_topic)
    )
    assert set(live_amounts) == set(day_of) and set(live_amounts.values()) == {1}
    with Ledger(pipeline.ledger_url) as ledger:
        backfill_cps = ledger.list_checkpoints(out[0]["backfill_pipeline"])
    assert backfill_cps and all(c.state is CheckpointState.COMMITTED for c in backfill_cps)
