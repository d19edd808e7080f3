"""Commit one PREPARED checkpoint as a Spark application: every commit shard's Kafka
transaction runs in a Spark task on an executor (spark/commit.py), this driver keeps the
ledger.

Runnable by ``spark-submit`` (``spark-submit .../apps/commit.py --pipeline mod:ATTR
--checkpoint N``); ``EoCommitOperator(commit_mode="spark")`` submits it. Imports Airflow
only to read a connection no task handed over (see
:func:`~airflow_provider_eo.apps.driver_pipeline`).

Prints the commit's summary (``CommitResult.summary()``: the checkpoint, ``published``,
``commit_mode``, the ``committer`` (this driver) and the ``publishers`` of every shard) as
one JSON line on stdout, and with ``--summary-file`` also writes it to that file (the
operator reads it in client deploy mode). Exits 0 when the checkpoint is COMMITTED
(already, or by this run), else non-zero with the reason on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from airflow_provider_eo import names
from airflow_provider_eo.apps import driver_pipeline
from airflow_provider_eo.apps.args import CommitAppArgs
from airflow_provider_eo.errors import EoError
from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.runtime import build_runtime

__all__ = ["EXIT_FAILED", "main"]

EXIT_FAILED = 2
"""Exit status of a commit that did not finish (the checkpoint stays PREPARED; a retry
finishes it)."""


def _write_summary(path: str, line: str) -> None:
    """Write the summary line to ``path`` whole (a reader never sees half of it)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(line + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit apps/commit.py --pipeline MOD:ATTR --checkpoint N [--actor-json J]
    [--summary-file PATH]``: a :class:`~airflow_provider_eo.apps.args.CommitAppArgs`, as the
    operator builds it."""
    args = CommitAppArgs.from_argv(argv, description=__doc__.splitlines()[0])
    pipeline = driver_pipeline(
        args.pipeline, kafka_conn_id=args.kafka_conn_id, ledger_conn_id=args.ledger_conn_id
    )
    actor = args.actor or Actor.here()

    from airflow_provider_eo.spark.session import get_spark

    # A speculative copy of a commit task is safe (its transactional id fences it) but
    # wasted: off unless the pipeline turns it on.
    spark = get_spark(
        names.commit_app_name(pipeline.name, args.checkpoint),
        {"spark.speculation": "false", **pipeline.spark_conf},
    )
    # This application is the commit's Spark side: its shards run as this session's tasks.
    rt = build_runtime(pipeline, spark=spark, commit_mode="spark", stage=False)
    try:
        with Ledger(pipeline.ledger_url) as ledger:
            result = rt.coordinator(ledger, actor).commit(args.checkpoint)
    except EoError as exc:
        print(
            f"{names.COMMIT_APP}: pipeline {pipeline.name!r}, checkpoint {args.checkpoint} was not "
            f"committed: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_FAILED
    line = json.dumps(result.summary(), default=str)
    print(line, flush=True)
    if args.summary_file:
        _write_summary(args.summary_file, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
