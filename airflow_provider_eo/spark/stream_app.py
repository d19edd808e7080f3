"""The streaming application's ``spark-submit`` entry point (DESIGN.md section 8):

    spark-submit .../stream_app.py --pipeline MOD:ATTR [--interval S] [--commit inline|airflow]
                                   [--duration S | --checkpoints N]

Runs :func:`airflow_provider_eo.core.stream.run_stream` on the session spark-submit gives
(local, standalone, YARN, Kubernetes); prints one JSON line per checkpoint and the summary
last. SIGTERM ends it cleanly (exit 0). Never imports Airflow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from airflow_provider_eo import names
from airflow_provider_eo.core.stream import COMMIT_MODES, StreamCheckpoint, run_stream
from airflow_provider_eo.ledger import Actor
from airflow_provider_eo.pipeline import load_pipeline
from airflow_provider_eo.spark.prepare import apply_overrides


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the stream until stopped, print the JSON summary."""
    parser = argparse.ArgumentParser(prog="eo-stream", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--commit", choices=COMMIT_MODES, default="inline")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, default=None)
    bound.add_argument("--checkpoints", type=int, default=None)
    parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
    args = parser.parse_args(argv)
    from airflow_provider_eo.spark.session import get_spark

    pipeline = apply_overrides(load_pipeline(args.pipeline), os.environ.get(names.PIPELINE_OVERRIDES_ENV))
    actor = Actor(**json.loads(args.actor_json)) if args.actor_json else Actor.here()
    spark = get_spark(f"eo-stream-{pipeline.name}", pipeline.spark_conf)

    def line(cp: StreamCheckpoint) -> None:
        print(json.dumps(cp.summary()), flush=True)

    result = run_stream(
        pipeline,
        interval_s=args.interval,
        commit=args.commit,
        duration_s=args.duration,
        max_checkpoints=args.checkpoints,
        spark=spark,
        actor=actor,
        on_checkpoint=line,
    )
    print(json.dumps(result.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
