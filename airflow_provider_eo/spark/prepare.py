"""Prepare one checkpoint with PySpark: read exactly its planned ranges, transform, stage.

Runnable by ``spark-submit`` (``spark-submit .../prepare.py --pipeline mod:ATTR --checkpoint N``).
Never imports Airflow.

The protocol step is :func:`airflow_provider_eo.core.prepare.prepare_checkpoint`; the Spark
work behind it is :class:`airflow_provider_eo.spark.stager.SparkStager`. This module parses
the arguments, builds the pipeline and runs the two.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from airflow_provider_eo import names
from airflow_provider_eo.core.prepare import prepare_checkpoint
from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.pipeline import Pipeline, load_pipeline
from airflow_provider_eo.spark.stager import SparkStager

__all__ = ["apply_overrides", "main"]


def apply_overrides(pipeline: Pipeline, overrides: str | None) -> Pipeline:
    """``pipeline`` with the settings that came from Airflow connections (the JSON the submit
    operator puts in :data:`names.PIPELINE_OVERRIDES_ENV`: ``kafka`` merged over the
    pipeline's, ``ledger_url`` replacing it); unchanged when ``overrides`` is empty."""
    if not overrides:
        return pipeline
    doc = json.loads(overrides)
    return dataclasses.replace(
        pipeline,
        kafka={**pipeline.kafka, **doc.get("kafka", {})},
        ledger_url=doc.get("ledger_url", pipeline.ledger_url),
    )


def main(argv: list[str] | None = None) -> int:
    """``spark-submit prepare.py --pipeline MOD:ATTR --checkpoint N [--attempt A]``; with
    ``--backfill-sink-topic TOPIC [--backfill-transform MOD:FN]`` the checkpoint is one of
    the pipeline's backfill into TOPIC (core/backfill.py)."""
    parser = argparse.ArgumentParser(prog=names.PREPARE_APP, description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
    parser.add_argument("--checkpoint", type=int, required=True)
    parser.add_argument("--attempt", default=None)
    parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
    parser.add_argument(
        "--backfill-sink-topic", default=None, help="prepare a checkpoint of the backfill into TOPIC"
    )
    parser.add_argument(
        "--backfill-transform", default=None, help="the backfill's transform MOD:FN (default: the pipeline's)"
    )
    args = parser.parse_args(argv)
    if args.backfill_transform and not args.backfill_sink_topic:
        parser.error("--backfill-transform needs --backfill-sink-topic")
    # Settings that came from Airflow connections (EoSubmitOperator kafka_conn_id /
    # ledger_conn_id) arrive in the environment, never on the command line.
    pipeline = apply_overrides(load_pipeline(args.pipeline), os.environ.get(names.PIPELINE_OVERRIDES_ENV))
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
    actor = Actor(**json.loads(args.actor_json)) if args.actor_json else Actor.here()
    stager = SparkStager(app_name=names.prepare_app_name(pipeline.name, args.checkpoint))
    stager.start(pipeline)  # an application without a session fails before opening the ledger
    with Ledger(pipeline.ledger_url) as ledger:
        result = prepare_checkpoint(
            pipeline, ledger, args.checkpoint, stager=stager, attempt=args.attempt, actor=actor
        )
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
