"""The scheduled backfill DAG over records with explicit timestamps spanning three days:
each daily run re-processes exactly its own data interval into the backfill sink, once;
running an interval again adds nothing. Real Airflow 3 (``dag.test()`` per logical date,
the DAG's data-interval timetable), Kafka and spark-submit.

The same runs are watched by the OpenLineage provider (file transport): the live pipeline's
plan, prepare and commit and each backfill emit START and COMPLETE events naming the Kafka
topics they read and write, with the checkpoints the ledger recorded in the ``eo`` facet,
and the prepare's spark-submit carries the task's OpenLineage run as Spark's parent job.
The pipeline's cluster comes from a ``kafka`` connection, as in a deployment."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import poll_until

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


def _lineage_events(path: Path) -> list[dict[str, Any]]:
    """The OpenLineage events the file transport wrote (one JSON document a line)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _task_events(events: list[dict[str, Any]], job: str) -> dict[str, list[dict[str, Any]]]:
    """``{eventType: [event, ...]}`` of the OpenLineage job ``<dag_id>.<task_id>``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["job"]["name"] == job:
            out.setdefault(event["eventType"], []).append(event)
    return out


def _topics(datasets: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_daily_runs_backfill_their_interval_once(
    airflow_env: Any, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    airflow_env.add_dag(ROOT / "dags" / "eo_backfill.py")
    # Records from 2025: time retention would delete them at once, so keep them forever.
    keep = {"retention.ms": "-1"}
    sink = make_topic("af-backfill", 3, **keep)
    lineage_file = airflow_env.home / "openlineage.jsonl"
    # The cluster as a deployment names it: the connection, whose settings win over the
    # pipeline's at run time (the code's server, spelt otherwise, only names the DAG's assets).
    port = kafka_bootstrap.rsplit(":", 1)[1]
    airflow_env.env.update(
        {
            "EO_DEMO_SOURCE_TOPIC": make_topic("af-src-old", 3, **keep),
            "EO_DEMO_SINK_TOPIC": make_topic("af-sink-old", 3, **keep),
            "EO_BACKFILL_SINK_TOPIC": sink,
            "EO_KAFKA_BOOTSTRAP": f"localhost:{port}",
            "EO_KAFKA_CONN_ID": "kafka_eo",
            "AIRFLOW_CONN_KAFKA_EO": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "eo-tests",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(lineage_file), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "true",
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
        json.loads(m.value())["amount"]
        for m in read_sink({"bootstrap.servers": kafka_bootstrap}, pipeline.sink_topic)
    )
    assert set(live_amounts) == set(day_of) and set(live_amounts.values()) == {1}
    with Ledger(pipeline.ledger_url) as ledger:
        backfill_cps = ledger.list_checkpoints(out[0]["backfill_pipeline"])
    assert backfill_cps and all(c.state is CheckpointState.COMMITTED for c in backfill_cps)
    with Ledger(pipeline.ledger_url) as ledger:
        (committed,) = ledger.list_checkpoints(pipeline.name)

    # OpenLineage: the listener emits from the task's process before the task ends; wait for
    # the last task's COMPLETE all the same (the file is written by a forked child).
    assert poll_until(
        lambda: (
            len(_task_events(_lineage_events(lineage_file), "eo_backfill.backfill").get("COMPLETE", [])) == 3
        ),
        timeout=30,
    ), _lineage_events(lineage_file)
    events = _lineage_events(lineage_file)
    # The connection's server (not the code's), as the OpenLineage naming spec writes it.
    namespace = f"kafka://{kafka_bootstrap}"
    assert kafka_bootstrap.startswith("127.0.0.1:"), kafka_bootstrap
    live_io = ([(namespace, pipeline.source_topics[0])], [(namespace, pipeline.sink_topic)])
    facets: dict[str, dict[str, dict[str, Any]]] = {}
    for task in ("eo.plan", "eo.prepare", "eo.commit"):
        by_type = _task_events(events, f"eo_pipeline.{task}")
        assert set(by_type) == {"START", "COMPLETE"}, (task, by_type)
        for (event,) in by_type.values():
            assert (_topics(event["inputs"]), _topics(event["outputs"])) == live_io, (task, event)
        facets[task] = {kind: e["run"]["facets"]["eo"] for kind, (e,) in by_type.items()}
    ranges = [
        {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in committed.ranges
    ]
    assert "checkpointId" not in facets["eo.plan"]["START"]  # nothing planned yet
    assert facets["eo.plan"]["COMPLETE"]["checkpointId"] == committed.checkpoint_id
    assert facets["eo.plan"]["COMPLETE"]["ranges"] == ranges
    assert facets["eo.prepare"]["START"]["checkpointId"] == committed.checkpoint_id
    done = facets["eo.commit"]["COMPLETE"]
    assert (done["checkpointId"], done["state"], done["records"], done["ranges"]) == (
        committed.checkpoint_id,
        "COMMITTED",
        committed.records,
        ranges,
    ), done
    assert committed.records == 3 * PER_DAY
    assert done["pipeline"] == pipeline.name and done["transactionalIdPrefix"] == "eo"
    backfills = _task_events(events, "eo_backfill.backfill")
    # One START and one COMPLETE per task run; a task that deferred on a prepare (the tests'
    # default deferrable: one deferral per backfill checkpoint) emits START again, with its
    # run's id, each time it resumes.
    assert len(backfills["COMPLETE"]) == 3
    assert len(backfills["START"]) == 3 + len(backfill_cps), backfills["START"]
    run_ids = {e["run"]["runId"] for e in backfills["COMPLETE"]}
    assert {e["run"]["runId"] for e in backfills["START"]} == run_ids
    for event in backfills["START"] + backfills["COMPLETE"]:
        assert (_topics(event["inputs"]), _topics(event["outputs"])) == (live_io[0], [(namespace, sink)])
    by_start = {
        e["run"]["facets"]["eo"]["start"]: e["run"]["facets"]["eo"] for e in backfills["COMPLETE"][:2]
    }
    for o in out[:2]:
        facet = by_start[o["start"]]
        assert (facet["checkpointIds"], facet["records"]) == (o["checkpoints"], PER_DAY), facet
        assert facet["backfillPipeline"] == o["backfill_pipeline"]
    assert {c for o in out[:2] for c in o["checkpoints"]} == {c.checkpoint_id for c in backfill_cps}
    # Spark's own OpenLineage events would name the prepare task's run as their parent.
    (prepare_start,) = _task_events(events, "eo_pipeline.eo.prepare")["START"]
    submitted = re.findall(r"spark\.openlineage\.parentRunId=([0-9a-f-]+)", airflow_env.log_text())
    assert prepare_start["run"]["runId"] in submitted, submitted
    assert "spark.openlineage.parentJobName=eo_pipeline.eo.prepare" in airflow_env.log_text()
