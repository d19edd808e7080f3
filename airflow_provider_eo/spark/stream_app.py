"""The streaming application's ``spark-submit`` entry point (DESIGN.md section 8):

    spark-submit .../stream_app.py --pipeline MOD:ATTR [--interval S] [--commit inline|airflow]
                                   [--duration S | --checkpoints N] [--run-id ID]
                                   [--heartbeat S] [--log-path PATH]

Runs :func:`airflow_provider_eo.core.stream.run_stream` on the session spark-submit gives
(local, standalone, YARN, Kubernetes); prints one JSON line per checkpoint and the summary
last. SIGTERM ends it cleanly (exit 0). Never imports Airflow.

``--report-file PATH`` appends the same JSON lines to ``PATH`` and, when the application
fails, a last ``{"error": ..., "traceback": [...]}`` line: how ``EoStreamOperator`` learns the
summary and the driver's reason in client mode without reading the Spark provider's hook
internals.

``--run-id`` names the run's row in the ledger (``eo_stream_runs``; a fresh id by default):
``EoStreamOperator(deferrable=True)`` picks the id, starts the driver detached and tracks the
row from the triggerer (heartbeat, ENDED with the summary, FAILED with the error).
``--log-path`` is recorded on the row (where the detached driver's output goes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import IO, Any

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
    parser.add_argument("--report-file", default=None, help="append the JSON lines (and a failure) here too")
    parser.add_argument("--run-id", default=None, help="the run's id in the ledger (default: a fresh one)")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between the run's heartbeats")
    parser.add_argument("--log-path", default=None, help="where this driver's output goes (recorded)")
    args = parser.parse_args(argv)
    report: IO[str] | None = open(args.report_file, "a") if args.report_file else None  # noqa: SIM115

    def emit(value: dict[str, Any]) -> None:
        text = json.dumps(value)
        print(text, flush=True)
        if report is not None:
            report.write(text + "\n")
            report.flush()

    try:
        from airflow_provider_eo.spark.stager import SparkStager

        pipeline = apply_overrides(load_pipeline(args.pipeline), os.environ.get(names.PIPELINE_OVERRIDES_ENV))
        actor = Actor(**json.loads(args.actor_json)) if args.actor_json else Actor.here()
        stager = SparkStager(app_name=f"eo-stream-{pipeline.name}")
        stager.start(pipeline)

        def line(cp: StreamCheckpoint) -> None:
            emit(cp.summary())

        result = run_stream(
            pipeline,
            interval_s=args.interval,
            commit=args.commit,
            duration_s=args.duration,
            max_checkpoints=args.checkpoints,
            stager=stager,
            actor=actor,
            on_checkpoint=line,
            run_id=args.run_id,
            heartbeat_s=args.heartbeat,
            log_path=args.log_path,
        )
        emit(result.summary())
        return 0
    except Exception as exc:
        if report is not None:
            lines = traceback.format_exc().splitlines()[-20:]
            emit({"error": f"{type(exc).__name__}: {exc}", "traceback": lines})
        raise
    finally:
        if report is not None:
            report.close()


if __name__ == "__main__":
    sys.exit(main())
