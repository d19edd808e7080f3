"""The streaming application's ``spark-submit`` entry point (docs/design.md §8):

    spark-submit .../apps/stream.py --pipeline MOD:ATTR [--interval S] [--commit inline|airflow]
                                   [--duration S | --checkpoints N] [--run-id ID]
                                   [--heartbeat S] [--log-path PATH]

Runs :func:`airflow_provider_eo.core.stream.run_stream` on the session spark-submit gives
(local, standalone, YARN, Kubernetes); prints one JSON line per checkpoint and the summary
last. SIGTERM ends it cleanly (exit 0). Imports Airflow only to read a connection no task
handed over (see :func:`~airflow_provider_eo.apps.driver_pipeline`).

``--report-file PATH`` appends the same JSON lines to ``PATH`` and, when the application
fails, a last ``{"error": ..., "traceback": [...]}`` line: how ``EoStreamOperator`` learns the
summary and the driver's reason in client mode without reading the Spark provider's hook
internals. The arguments are a :class:`~airflow_provider_eo.core.stream_contract.StreamAppArgs`
and the lines a :class:`~airflow_provider_eo.core.stream_contract.StreamReport`: the operator
builds and reads the same two objects.

``--run-id`` names the run's row in the ledger (``eo_stream_runs``; a fresh id by default):
``EoStreamOperator(deferrable=True)`` picks the id, starts the driver detached and tracks the
row from the triggerer (heartbeat, ENDED with the summary, FAILED with the error).
``--log-path`` is recorded on the row (where the detached driver's output goes).
"""

from __future__ import annotations

import sys

from airflow_provider_eo.apps import driver_pipeline
from airflow_provider_eo.core.stream import StreamCheckpoint, run_stream
from airflow_provider_eo.core.stream_contract import StreamAppArgs, StreamFailure, StreamReportWriter
from airflow_provider_eo.ledger import Actor
from airflow_provider_eo.metrics import AirflowStatsSink


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the stream until stopped, print the JSON summary."""
    args = StreamAppArgs.from_argv(argv, description=__doc__.splitlines()[0])
    report = StreamReportWriter(args.report_file)

    try:
        from airflow_provider_eo.runtime import build_runtime

        args.validate()
        pipeline = driver_pipeline(
            args.pipeline, kafka_conn_id=args.kafka_conn_id, ledger_conn_id=args.ledger_conn_id
        )
        actor = args.actor or Actor.here()
        # eo.* metrics through Airflow's Stats ([metrics])
        rt = build_runtime(pipeline, app_name=f"eo-stream-{pipeline.name}", metrics=AirflowStatsSink())
        rt.stager.start(pipeline)

        def line(cp: StreamCheckpoint) -> None:
            report.checkpoint(cp.summary())

        result = run_stream(
            rt.pipeline,
            interval_s=args.interval,
            commit=args.commit,
            duration_s=args.duration,
            max_checkpoints=args.checkpoints,
            stager=rt.stager,
            actor=actor,
            on_checkpoint=line,
            run_id=args.run_id,
            heartbeat_s=args.heartbeat,
            log_path=args.log_path,
            runner=rt.runner,
            metrics=rt.metrics,
        )
        report.summary(result.summary())
        return 0
    except Exception as exc:
        if args.report_file is not None:
            report.failure(StreamFailure.of(exc))
        raise
    finally:
        report.close()


if __name__ == "__main__":
    sys.exit(main())
