"""Where a commit runs: in this process (``local``) or as Spark tasks (``spark``)."""

from __future__ import annotations

from typing import Literal

from airflow_provider_eo.pipeline import COMMIT_MODES

#: A commit that must start its own Spark application (``eo commit`` alone, a spark-submit
#: from Airflow) pays 10-18 s before the first record (measured: docs/benchmarks.md), what
#: a local commit publishes in 5-10M records: ``auto`` needs this many times the threshold.
NEW_APPLICATION_FACTOR = 10


def resolve_commit_mode(
    requested: str,
    *,
    master: str,
    records: int,
    min_records: int,
    session_running: bool = True,
    executors_elsewhere: bool = True,
) -> Literal["local", "spark"]:
    """Where a commit runs. ``local`` and ``spark`` are taken as given. ``auto`` is ``spark``
    only when the Spark cores are worth it (docs/benchmarks.md, commit scale):

    - the master is a cluster (not ``local``/``local[N]``/``local-cluster``), and
    - the checkpoint has at least ``min_records`` records (a Spark job costs ~0.8 s more
      than a local commit; one core publishes ~500k records/s), and
    - the running session's executors are not all on this host (there, Spark adds
      processes but no cores: measured slower at 4M on 2 cores), and
    - with no session running yet, the checkpoint has :data:`NEW_APPLICATION_FACTOR` times
      ``min_records`` (the application's start is paid first).

    Else ``local``.
    """
    if requested not in COMMIT_MODES:
        raise ValueError(f"commit mode {requested!r} is not one of {', '.join(COMMIT_MODES)}")
    if requested == "local":
        return "local"
    if requested == "spark":
        return "spark"
    clustered = not (master == "local" or master.startswith(("local[", "local-")))
    if not clustered or records < min_records:
        return "local"
    if session_running and not executors_elsewhere:
        return "local"
    if not session_running and records < NEW_APPLICATION_FACTOR * min_records:
        return "local"
    return "spark"
