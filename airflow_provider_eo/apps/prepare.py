"""Prepare one checkpoint with PySpark: read exactly its planned ranges, transform, stage.

Runnable by ``spark-submit`` (``spark-submit .../prepare.py --pipeline mod:ATTR --checkpoint N``).
Imports Airflow only to read a connection no task handed over (see
:func:`~airflow_provider_eo.apps.driver_pipeline`).

The protocol step is :func:`airflow_provider_eo.core.prepare.prepare_checkpoint`; the Spark
work behind it is :class:`airflow_provider_eo.spark.stager.SparkStager`. This module parses
the arguments, builds the pipeline and runs the two.
"""

from __future__ import annotations

import json
import sys

from airflow_provider_eo import names
from airflow_provider_eo.apps import driver_pipeline
from airflow_provider_eo.apps.args import PrepareAppArgs
from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.metrics import AirflowStatsSink
from airflow_provider_eo.runtime import build_runtime

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``spark-submit prepare.py --pipeline MOD:ATTR --checkpoint N [--attempt A]``; with
    ``--backfill-sink-topic TOPIC [--backfill-transform MOD:FN]`` the checkpoint is one of
    the pipeline's backfill into TOPIC (core/backfill.py). The arguments are a
    :class:`~airflow_provider_eo.apps.args.PrepareAppArgs`, as the operator builds them."""
    args = PrepareAppArgs.from_argv(argv, description=__doc__.splitlines()[0])
    pipeline = driver_pipeline(
        args.pipeline, kafka_conn_id=args.kafka_conn_id, ledger_conn_id=args.ledger_conn_id
    )
    if args.backfill_sink_topic:
        from airflow_provider_eo.core.backfill import backfill_pipeline

        # The backfill's plan already refused the live sink unless it was allowed: a
        # checkpoint of that backfill exists only then.
        pipeline = backfill_pipeline(
            pipeline,
            args.backfill_sink_topic,
            transform=args.backfill_transform,
            allow_live_sink=True,
        )
    actor = args.actor or Actor.here()
    # A prepare this run did is reported as eo.prepare.seconds through Airflow's Stats.
    rt = build_runtime(
        pipeline, app_name=names.prepare_app_name(pipeline.name, args.checkpoint), metrics=AirflowStatsSink()
    )
    rt.stager.start(pipeline)  # an application without a session fails before opening the ledger
    with Ledger(pipeline.ledger_url) as ledger:
        result = rt.coordinator(ledger, actor).prepare(args.checkpoint, rt.stager, attempt=args.attempt)
    print(
        json.dumps(
            {
                "pipeline": pipeline.name,
                "checkpoint": args.checkpoint,
                "state": result.checkpoint.state.value,
                "attempt": result.attempt,
                "records": result.records,
                "records_read": result.records_read,
                "note": result.note,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
