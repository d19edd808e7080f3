"""``eo demo --no-airflow``: the main job on the embedded defaults, plan/prepare/commit
called directly: a real broker, real Spark, a round trip."""

from __future__ import annotations

import time
import uuid

from airflow_provider_eo.demo.sample import DEMO_TOPIC, seed_demo_topics
from airflow_provider_eo.render import OK, console, print_audit, print_checkpoints


def run_demo(*, keep_broker: bool = False, checkpoints: int = 3) -> int:
    """The main job on the embedded defaults: a real broker, Spark local, a SQLite ledger.

    Produces sample events (with an aborted transaction among them), runs the pipeline for
    ``checkpoints`` checkpoints (plan -> prepare -> commit, exactly once), then prints the
    ledger's checkpoint table and the audit of the sink. Returns the exit code.
    """
    from airflow_provider_eo.core.audit import audit_pipeline
    from airflow_provider_eo.core.runner import run_once
    from airflow_provider_eo.ledger import Ledger
    from airflow_provider_eo.pipeline import Pipeline
    from airflow_provider_eo.runtime import build_runtime
    from airflow_provider_eo.spark.session import get_spark
    from airflow_provider_eo.stack.kafka import LocalKafka
    from airflow_provider_eo.stack.paths import state_dir

    started = time.monotonic()
    kafka = LocalKafka()
    already_running = kafka.info() is not None  # then `eo dev up` owns it: leave it up
    with console.status("starting the local Kafka broker (KRaft) ..."):
        info = kafka.up()
    console.print(f"{OK} Kafka {info.version} on {info.bootstrap}  ({time.monotonic() - started:.1f}s)")
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
            f"{OK} produced {committed} committed and {aborted} aborted events into "
            f"{source!r}; pipeline {pipeline.name!r} -> {sink!r}, "
            f"max {pipeline.max_records_per_checkpoint} offsets per checkpoint"
        )
        with console.status("starting Spark (local) ..."):
            spark = get_spark("eo-demo")
        rt = build_runtime(pipeline, spark=spark)
        with Ledger(pipeline.ledger_url) as ledger:
            for n in range(1, checkpoints + 1):
                with console.status(f"checkpoint {n}/{checkpoints}: plan -> prepare (Spark) -> commit ..."):
                    result = run_once(pipeline, ledger=ledger, stager=rt.stager, runner=rt.runner)
                cp = result.checkpoint
                if cp is None:
                    console.print("  nothing new to read")
                    break
                console.print(
                    f"{OK} checkpoint {cp.checkpoint_id} {cp.state.value}: {cp.records} records, "
                    f"{', '.join(r.compact() for r in cp.ranges)}  ({result.seconds:.1f}s)"
                )
            print_checkpoints(ledger.list_checkpoints(pipeline.name))
            report = audit_pipeline(pipeline, ledger)
        print_audit(report)
        console.print(
            f"ledger: {pipeline.ledger_url}  —  try: .venv/bin/eo checkpoints {pipeline.name} "
            f"--ledger-url {pipeline.ledger_url}   [{time.monotonic() - started:.1f}s]"
        )
        return 0 if report.ok and report.checkpoints else 1
    finally:
        if spark is not None:
            spark.stop()
        if not keep_broker and not already_running:
            # The commits' kept producers go first: left to the exit, they would log the
            # stopped broker's refused connections.
            from airflow_provider_eo.kafka.producer_pool import close_producers

            close_producers()
            kafka.down()
            console.print("broker stopped (use --keep to leave it running)")
