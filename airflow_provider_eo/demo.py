"""The README's main job on the embedded defaults: a real broker, real Spark, a round trip."""

from __future__ import annotations

import json
import time
import uuid

from rich.console import Console
from rich.table import Table

console = Console(stderr=False, highlight=False)

DEMO_TOPIC = "eo-demo-events"


def _produce_sample(bootstrap: str, topic: str) -> tuple[int, int]:
    """Produce sample events: two committed transactions with an aborted one in between.

    Returns (committed records, aborted records).
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"eo-demo-producer-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    committed = aborted = 0
    for batch, commit in ((0, True), (1, False), (2, True)):
        producer.begin_transaction()
        for i in range(20):
            key = f"user-{i % 7}"
            event = {"batch": batch, "seq": i, "user": key, "amount": (i * 37) % 100}
            producer.produce(topic, key=key, value=json.dumps(event), partition=i % 3)
        if commit:
            producer.commit_transaction(30)
            committed += 20
        else:
            producer.flush(30)
            producer.abort_transaction(30)
            aborted += 20
    return committed, aborted


def run_demo(*, keep_broker: bool = False) -> int:
    """Bring up the stack, produce sample events, read a bounded range back through
    Spark's Kafka source (read_committed) and print it. Returns the exit code."""
    from airflow_provider_eo.kafka.admin import ensure_topic, list_offsets
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka

    started = time.monotonic()
    kafka = LocalKafka()
    with console.status("starting the local Kafka broker (KRaft) ..."):
        info = kafka.up()
    console.print(
        f"[green]✓[/] Kafka {info.version} on {info.bootstrap}  ({time.monotonic() - started:.1f}s)"
    )
    spark = None
    try:
        conf = {"bootstrap.servers": info.bootstrap}
        ensure_topic(conf, DEMO_TOPIC, partitions=3)
        parts = [(DEMO_TOPIC, p) for p in range(3)]
        before = list_offsets(conf, parts, spec="latest")
        committed, aborted = _produce_sample(info.bootstrap, DEMO_TOPIC)
        after = list_offsets(conf, parts, spec="latest")
        console.print(
            f"[green]✓[/] produced {committed} committed and {aborted} aborted events into "
            f"{DEMO_TOPIC!r} (3 partitions)"
        )
        starting = {DEMO_TOPIC: {str(p): before[(DEMO_TOPIC, p)] for _, p in parts}}
        ending = {DEMO_TOPIC: {str(p): after[(DEMO_TOPIC, p)] for _, p in parts}}
        console.print(f"  bounded range: startingOffsets={json.dumps(starting)}")
        console.print(f"                 endingOffsets={json.dumps(ending)}")
        with console.status("starting Spark (local) and reading the range ..."):
            spark = get_spark("eo-demo")
            df = (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", info.bootstrap)
                .option("kafka.isolation.level", "read_committed")
                .option("subscribe", DEMO_TOPIC)
                .option("startingOffsets", json.dumps(starting))
                .option("endingOffsets", json.dumps(ending))
                .load()
            )
            rows = (
                df.selectExpr(
                    "partition",
                    "offset",
                    "CAST(key AS STRING) AS key",
                    "CAST(value AS STRING) AS value",
                )
                .orderBy("partition", "offset")
                .collect()
            )
        table = Table(title=f"Spark read {len(rows)} records of {DEMO_TOPIC} (read_committed)")
        for col in ("partition", "offset", "key", "value"):
            table.add_column(col)
        for row in rows[:12]:
            table.add_row(str(row.partition), str(row.offset), row.key, row.value)
        if len(rows) > 12:
            table.add_row("…", "…", "…", f"{len(rows) - 12} more")
        console.print(table)
        from_aborted = sum(1 for r in rows if json.loads(r.value)["batch"] == 1)
        ok = len(rows) == committed and from_aborted == 0
        mark = "[green]✓[/]" if ok else "[red]✗[/]"
        console.print(
            f"{mark} round trip: {len(rows)} records read, {committed} committed expected, "
            f"{from_aborted} from the aborted transaction (expected 0)  "
            f"[{time.monotonic() - started:.1f}s]"
        )
        return 0 if ok else 1
    finally:
        if spark is not None:
            spark.stop()
        if not keep_broker:
            kafka.down()
            console.print("broker stopped (use --keep to leave it running)")
