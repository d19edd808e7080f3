"""The README's main job on the embedded defaults: a real broker, real Spark, a round trip."""

from __future__ import annotations

import json
import sys
import time
import uuid

from rich.console import Console

# Wide enough for the tables when the output is a file or a CI log, not a terminal.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

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


def seed_demo_topics(bootstrap: str, source: str, sink: str) -> tuple[int, int]:
    """Create the demo's source and sink topics (3 partitions each) and produce the sample
    events into the source. Returns (committed records, aborted records)."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    conf = {"bootstrap.servers": bootstrap}
    ensure_topic(conf, source, partitions=3)
    ensure_topic(conf, sink, partitions=3)
    return _produce_sample(bootstrap, source)


def run_demo(*, keep_broker: bool = False, checkpoints: int = 3) -> int:
    """The main job on the embedded defaults: a real broker, Spark local, a SQLite ledger.

    Produces sample events (with an aborted transaction among them), runs the pipeline for
    ``checkpoints`` checkpoints (plan -> prepare -> commit, exactly once), then prints the
    ledger's checkpoint table and the audit of the sink. Returns the exit code.
    """
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.kafka.audit import audit_pipeline
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.ledger.cli import render_checkpoints_table
    from airflow_provider_eo.pipeline import Pipeline
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka
    from airflow_provider_eo.stack.paths import state_dir

    started = time.monotonic()
    kafka = LocalKafka()
    already_running = kafka.info() is not None  # then `eo dev up` owns it: leave it up
    with console.status("starting the local Kafka broker (KRaft) ..."):
        info = kafka.up()
    console.print(
        f"[green]✓[/] Kafka {info.version} on {info.bootstrap}  ({time.monotonic() - started:.1f}s)"
    )
    spark = None
    try:
        run = uuid.uuid4().hex[:6]
        source, sink = f"{DEMO_TOPIC}-{run}", f"{DEMO_TOPIC}-enriched-{run}"
        conf = {"bootstrap.servers": info.bootstrap}
        committed, aborted = seed_demo_topics(info.bootstrap, source, sink)
        demo_dir = state_dir() / "demo" / run
        pipeline = Pipeline(
            name=f"demo-{run}",
            kafka=conf,
            source_topics=[source],
            sink_topic=sink,
            transform="airflow_provider_eo.examples.transforms:enrich",
            ledger_url=f"sqlite:///{demo_dir / 'ledger.db'}",
            staging_dir=str(demo_dir / "staging"),
            max_records_per_checkpoint=25,
        )
        demo_dir.mkdir(parents=True, exist_ok=True)
        console.print(
            f"[green]✓[/] produced {committed} committed and {aborted} aborted events into "
            f"{source!r}; pipeline {pipeline.name!r} -> {sink!r}, "
            f"max {pipeline.max_records_per_checkpoint} offsets per checkpoint"
        )
        with console.status("starting Spark (local) ..."):
            spark = get_spark("eo-demo")
        ledger = Ledger(pipeline.ledger_url)
        for n in range(1, checkpoints + 1):
            with console.status(f"checkpoint {n}/{checkpoints}: plan -> prepare (Spark) -> commit ..."):
                result = run_once(pipeline, ledger=ledger, spark=spark)
            cp = result.checkpoint
            if cp is None:
                console.print("  nothing new to read")
                break
            console.print(
                f"[green]✓[/] checkpoint {cp.checkpoint_id} {cp.state.value}: {cp.records} records, "
                f"{', '.join(r.compact() for r in cp.ranges)}  ({result.seconds:.1f}s)"
            )
        console.print(render_checkpoints_table(ledger.list_checkpoints(pipeline.name)))
        report = audit_pipeline(pipeline, ledger)
        from airflow_provider_eo.cli import print_audit

        print_audit(report)
        ledger.close()
        console.print(
            f"ledger: {pipeline.ledger_url}  —  try: .venv/bin/eo checkpoints {pipeline.name} "
            f"--ledger-url {pipeline.ledger_url}   [{time.monotonic() - started:.1f}s]"
        )
        return 0 if report.ok and report.checkpoints else 1
    finally:
        if spark is not None:
            spark.stop()
        if not keep_broker and not already_running:
            kafka.down()
            console.print("broker stopped (use --keep to leave it running)")
