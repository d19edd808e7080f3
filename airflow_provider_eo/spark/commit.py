"""The commit as a Spark job: each commit shard's transaction runs in a Spark task, on an
executor, so the process that drives the commit (the Airflow worker, ``eo commit``, the
stream driver) publishes no record.

One Spark job per shard, submitted from its own driver thread, so the driver records each
shard's outcome in the ledger as it arrives. A task runs
:func:`~airflow_provider_eo.core.shard.commit_shard` on the shard's frozen committable
(fence, marker, publish the staged files read on the executor, seal, commit) and returns a
:class:`Publisher`; it never touches the ledger. Its hooks stand in for the ledger's:

- the driver records every shard PENDING (under the commit lease) before any task starts,
  so the "no transaction was ever begun" proof of a missing marker holds only when no row
  existed before this commit *and* the task is the first attempt: a Spark retry (executor
  lost, a speculative copy) may follow an attempt that began one, and reads back the output.
- A second attempt of a task while the first is still alive (a zombie) is fenced by its
  ``init_transactions``; whichever commits, the marker makes the other skip.

Never imports Airflow or the ledger on the executor side.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_eo import names
from airflow_provider_eo.core.abort_marks import refuse_if_aborted
from airflow_provider_eo.core.fault_seam import fault_point
from airflow_provider_eo.core.shard import (
    KafkaClients,
    Publisher,
    RealKafka,
    ShardCommittable,
    ShardFailure,
    ShardTask,
    commit_shard,
)
from airflow_provider_eo.spark.session import is_local_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_eo.pipeline import Pipeline


class _TaskHooks:
    """:class:`~airflow_provider_eo.core.shard.ShardHooks` inside a Spark task: no ledger.
    Before each ``begin_transaction`` (after the round's ``init_transactions``) the shard's
    abort mark is read: a task that begins after an abort fenced the shard refuses
    (core/abort_marks.py), since the driver's lease may have lapsed long before it started."""

    def __init__(
        self, committable: ShardCommittable, clients: KafkaClients, *, row_before: bool, retried: bool
    ) -> None:
        self.committable = committable
        self.clients = clients
        self.row_before = row_before
        self.retried = retried
        self.began: float | None = None
        self.finished: float | None = None

    def may_have_published(self) -> bool:
        return self.row_before or self.retried

    def before_begin(self) -> None:
        refuse_if_aborted(self.committable, self.clients)
        self.began = time.monotonic()

    def committed(self, records: int) -> None:
        self.finished = time.monotonic()


def _executor_of_this_worker() -> str:
    """The Spark executor whose Python worker runs this task: its ``--executor-id`` (read
    from the nearest ancestor JVM's command line), ``"driver"`` when that JVM is the driver
    (local mode), ``"unknown"`` where /proc does not tell."""
    pid = os.getppid()
    try:
        while pid > 1:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if args and args[0].endswith(b"java"):
                if b"--executor-id" in args:
                    return args[args.index(b"--executor-id") + 1].decode()
                return "driver"
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _task_identity() -> tuple[str, int]:
    """The task's executor id and attempt number (a retry of the task counts as a later
    attempt; a commit job has no shuffle, so its stage is never resubmitted)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return _executor_of_this_worker(), (ctx.attemptNumber() if ctx is not None else 0)


def _on_this_host(host: str, driver: str) -> bool:
    """``host`` (a block manager's) is this machine: a loopback address, the driver's
    address, or this host name's (names resolved: Spark may say ``localhost`` for the driver
    and ``127.0.0.1`` for an executor on the same machine)."""

    def resolve(name: str) -> str | None:
        try:
            return socket.gethostbyname(name)
        except OSError:
            return None

    address = resolve(host)
    if address is None:
        return False
    here = {resolve(driver), resolve(socket.gethostname())}
    return address.startswith("127.") or address in here


def run_shard_task(
    tasks: Iterable[ShardTask], clients: KafkaClients | None = None
) -> Iterator[Publisher | ShardFailure]:
    """The body of one commit task (runs on an executor): commit each shard given, through
    ``clients`` (default: the real cluster, with the shard's own client config)."""
    executor, attempt = _task_identity()
    host, pid = socket.gethostname(), os.getpid()
    for task in tasks:
        c = task.committable
        fault_point("commit.task_start")
        kafka = clients if clients is not None else RealKafka(c.config)
        hooks = _TaskHooks(c, kafka, row_before=task.row_before, retried=attempt > 0)
        try:
            result = commit_shard(c, hooks, kafka)
        except Exception as exc:
            yield ShardFailure(c.shard, type(exc).__name__, str(exc), host, pid)
            continue
        seconds = None
        if hooks.began is not None and hooks.finished is not None and not result.skipped:
            seconds = max(0.0, hooks.finished - hooks.began)
        yield Publisher(
            shard=c.shard,
            host=host,
            pid=pid,
            records=result.records,
            executor=executor,
            attempt=attempt,
            skipped=result.skipped,
            publish_s=seconds,
        )


def run_shard_job(spark: SparkSession, task: ShardTask, *, description: str) -> Publisher | ShardFailure:
    """One Spark job with one task that commits ``task``'s shard; blocks until it ends.

    Called from a driver thread per shard (Spark runs jobs of several threads at once). A
    job that fails as a whole (the task's process lost more than ``spark.task.maxFailures``
    times) raises Spark's error; the shard is then unfinished and a retry of the commit
    finishes it.
    """
    sc = spark.sparkContext
    group = names.commit_app_name(task.committable.pipeline, task.committable.checkpoint_id)
    sc.setJobGroup(group, description)  # the description is what the Spark UI shows
    (outcome,) = sc.parallelize([task], 1).mapPartitions(run_shard_task).collect()
    return outcome


def run_shard_jobs(
    spark: SparkSession,
    tasks: list[ShardTask],
    *,
    on_outcome: Callable[[Publisher | ShardFailure], None],
) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
    """Commit ``tasks`` in parallel, one Spark job each, calling ``on_outcome`` (in the
    caller's thread) as each shard's outcome arrives. Returns every shard's outcome (or the
    exception of a job that failed as a whole), in the order they arrived."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    out: list[tuple[int, Publisher | ShardFailure | BaseException]] = []
    if not tasks:
        return out
    with ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="eo-commit-shard") as pool:
        shard_of: dict[Future[Publisher | ShardFailure], int] = {}
        for task in tasks:
            c = task.committable
            description = (
                f"eo commit: pipeline {c.pipeline!r}, checkpoint {c.checkpoint_id}, shard {c.shard} "
                f"({c.records} records to {c.sink_topic})"
            )
            shard_of[pool.submit(run_shard_job, spark, task, description=description)] = c.shard
        pending = set(shard_of)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                error = future.exception()
                if error is not None:
                    out.append((shard_of[future], error))
                    continue
                outcome = future.result()
                out.append((shard_of[future], outcome))
                on_outcome(outcome)
    return out


class SparkShardRunner:
    """:class:`~airflow_provider_eo.core.shard.ShardRunner` on Spark: the running
    SparkSession (the stream's, the prepare's under spark-submit) or, on first use, one
    started with the pipeline's ``spark_conf``. A session eo starts for a commit turns
    speculative execution off unless the pipeline turns it on: a speculative copy of a commit
    task is safe (fenced by the shard's transactional id) but wasted."""

    def __init__(self, pipeline: Pipeline, spark: SparkSession | None = None) -> None:
        self.pipeline = pipeline
        self._spark = spark

    def _running(self) -> SparkSession | None:
        if self._spark is not None:
            return self._spark
        if "pyspark" not in sys.modules:  # never start a JVM just to ask
            return None
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession() or SparkSession._instantiatedSession

    @property
    def master(self) -> str:
        """The running session's master, else the pipeline's ``spark.master``, else
        ``EO_SPARK_MASTER``, else local."""
        running = self._running()
        if running is not None:
            return str(running.sparkContext.master)
        conf = self.pipeline.spark_conf
        return str(conf.get("spark.master") or os.environ.get("EO_SPARK_MASTER") or "local[2]")

    @property
    def session_running(self) -> bool:
        """A session is running in this process already."""
        return self._running() is not None

    @property
    def executors_elsewhere(self) -> bool:
        """Some executor of the running session is on another host than the driver (True
        while none has registered, or when this cannot be read)."""
        running = self._running()
        if running is None:
            return True
        try:
            sc = running.sparkContext
            driver = str(sc.getConf().get("spark.driver.host") or "")
            # "host:port" of every block manager, the driver's included (a Scala Map).
            status = sc._jsc.sc().getExecutorMemoryStatus()
            managers = [str(k).rsplit(":", 1)[0] for k in str(status.keys().mkString("\n")).split("\n") if k]
        except Exception:
            return True
        if is_local_master(str(sc.master)):
            return False  # the executors are the driver's own JVM
        if len(managers) <= 1:
            return True  # no executor registered yet: a cluster's usually are elsewhere
        return not all(_on_this_host(host, driver) for host in managers)

    @property
    def spark(self) -> SparkSession:
        """The session the commit jobs run in (started on first use)."""
        if self._spark is None:
            running = self._running()
            if running is None:
                from airflow_provider_eo.spark.session import get_spark

                conf = {"spark.speculation": "false", **self.pipeline.spark_conf}
                running = get_spark(names.commit_app_name(self.pipeline.name), conf)
            self._spark = running
        return self._spark

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        """:func:`run_shard_jobs` in :attr:`spark`."""
        return run_shard_jobs(self.spark, tasks, on_outcome=on_outcome)

    def unavailable(self) -> str | None:
        """Why no commit task can run here (None: the session is running or starts now)."""
        try:
            self.spark  # noqa: B018 (starts the session: the question is whether it can)
        except Exception as exc:  # pyspark missing, no Java, the master refused the app
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"Spark could not be started ({type(exc).__name__}: {first[:300]})"
        return None

    def cancel(self, pipeline: str, checkpoint_id: int) -> None:
        """Cancel the commit jobs of ``checkpoint_id`` (their job group): no queued task of
        them starts, running ones are killed (a Python worker within
        ``spark.python.task.killTimeout``). Safe from any thread."""
        if self._spark is not None:
            self._spark.sparkContext.cancelJobGroup(names.commit_app_name(pipeline, checkpoint_id))


def resolve_runner(pipeline: Pipeline, spark: SparkSession | None = None) -> SparkShardRunner | None:
    """Where ``pipeline``'s commits run their shards, the same for every entry point: None
    for ``commit_mode='local'`` (in the committing process); else a :class:`SparkShardRunner`
    on ``spark`` (the caller's session), else on the running session or one it starts on
    first use. Whether a spark-mode commit may fall back to this process when Spark cannot
    start is the caller's (``Coordinator(fallback=...)``: recovery and backfill do)."""
    if pipeline.commit_mode == "local":
        return None
    return SparkShardRunner(pipeline, spark)


__all__ = ["SparkShardRunner", "resolve_runner", "run_shard_job", "run_shard_jobs", "run_shard_task"]
