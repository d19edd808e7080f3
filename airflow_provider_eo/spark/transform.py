"""The user's transform: loading it, telling its failures from the environment's, and
finding the first record it fails on (the poison-record search).

Only a failure raised by the user's code (a Python UDF, a Spark expression) counts as bad
data and starts the search; Kafka or filesystem failures are reported as such, and so are
failures of the executors' environment (the transform's module missing on the executors,
mismatched Pythons, an unpicklable function), which no record causes. A failure that the
search pins on the first record is tried on the last record too: when both fail, the
message says the transform's code (or environment) is the likely cause, not one record.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from airflow_provider_eo.errors import KafkaAccessDenied, PrepareError, SparkEnvironmentError, TransformError
from airflow_provider_eo.kafka.acls import java_access_denied
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.source import with_provenance

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Transform = Callable[["DataFrame"], "DataFrame"]

# Spark jobs the poison-record search may run (each reads one sub-range).
MAX_POISON_JOBS = 40


def load_transform(ref: str | None) -> Transform:
    """Import the pipeline's ``module:function`` transform (identity when ``None``)."""
    if ref is None:
        return lambda df: df
    module_name, _, func = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), func)
    except (ImportError, AttributeError) as exc:
        raise PrepareError(f"cannot load transform {ref!r}: {exc}") from exc
    if not callable(fn):
        raise PrepareError(f"transform {ref!r} is not callable")
    return fn  # type: ignore[no-any-return,unused-ignore]


def apply_transform(transform: Transform, source: DataFrame, *, ref: str | None, where: str) -> DataFrame:
    """``transform(source)``; an exception while building the plan is a :class:`TransformError`."""
    try:
        return transform(source)
    except PrepareError:
        raise
    except Exception as exc:
        raise TransformError(f"{where}: transform {ref!r} raised: {exc!r}") from exc


def is_transform_failure(exc: BaseException) -> bool:
    """A failure raised by the user's code (a Python UDF, a Spark expression) rather than
    by Kafka or the filesystem."""
    from pyspark.errors import ArithmeticException, NumberFormatException, PythonException

    if isinstance(exc, (PythonException, ArithmeticException, NumberFormatException)):
        return True
    text = str(exc)
    return "PythonException" in text or "Python worker" in text or "SparkArithmeticException" in text


_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?")

# (pattern in the job's error text, what to do) for failures no record can cause.
_ENVIRONMENT = (
    (
        re.compile(r"(?:ModuleNotFoundError|ImportError)\b"),
        "ship the transform's module to the executors (EoSubmitOperator(py_files=...) or "
        "spark-submit --py-files / --archives) or install it on every Spark node",
    ),
    (
        re.compile(r"Python in worker has different version|PYTHON_VERSION_MISMATCH"),
        "use the same Python on the driver and the executors (PYSPARK_PYTHON / spark.pyspark.python)",
    ),
    (
        re.compile(r"Cannot run program \"[^\"]*python|PYTHON_EXECUTABLE"),
        "install the Python named by PYSPARK_PYTHON / spark.pyspark.python on every Spark node",
    ),
    (
        # The Java client's ACL refusals (Topic/Group/TransactionalId/ClusterAuthorization):
        # the broker refuses every record alike, so no record is searched for or blamed.
        # (A bounded name: an unbounded \w+ backtracks quadratically over a long run of word
        # characters, e.g. a large record's value quoted in the error.)
        re.compile(r"\w{1,64}AuthorizationException"),
        "grant the ACL the Kafka error names (`eo doctor --acls` prints every ACL the pipeline needs)",
    ),
    (
        re.compile(r"PicklingError|Could not serialize|UnpicklingError"),
        "make the transform's functions picklable (no open clients, locks or sessions "
        "captured in a UDF's closure)",
    ),
)


#: How much of a job's error text the environment patterns read, from each end: the error
#: names sit in the first and last lines; the middle may quote megabytes of a record.
_ERROR_TEXT_EDGE = 64 * 1024


def _head_and_tail(text: str) -> str:
    if len(text) <= 2 * _ERROR_TEXT_EDGE:
        return text
    return text[:_ERROR_TEXT_EDGE] + "\n...\n" + text[-_ERROR_TEXT_EDGE:]


def environment_failure(exc: BaseException) -> str | None:
    """What to fix when ``exc`` is a failure of the executors' environment rather than of a
    record (None otherwise): a module missing on the executors, mismatched Pythons, a
    function that cannot be pickled."""
    text = _head_and_tail(str(exc))
    for pattern, advice in _ENVIRONMENT:
        if pattern.search(text):
            missing = _MISSING_MODULE.search(text)
            if missing:
                return f"module {missing.group(1)!r} is not importable on the executors: {advice}"
            return advice
    return None


def short_error(exc: BaseException) -> str:
    """The telling line of a (long, JVM-wrapped) Spark error: the last one naming an error."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the Python error line inside Spark's wrapper
        if "Error" in ln or "Exception" in ln:
            return ln.strip()[:500]
    return (lines[-1] if lines else type(exc).__name__)[:500]


def first_failing_offset(
    ranges: list[RangeSpec], fails: Callable[[RangeSpec], bool], max_calls: int = MAX_POISON_JOBS
) -> tuple[str, int, int] | None:
    """Bisect ``ranges`` for the first offset on which ``fails`` holds: (topic, partition,
    offset), or None when no range fails or ``max_calls`` runs out before one offset is left.

    ``fails`` is asked about whole ranges first, then about halves of the first failing one.
    """
    calls = 0

    def ask(r: RangeSpec) -> bool:
        nonlocal calls
        calls += 1
        return fails(r)

    for r in ranges:
        if r.end <= r.start or calls >= max_calls or not ask(r):
            continue
        lo, hi = r.start, r.end  # the failure lies in [lo, hi)
        while hi - lo > 1 and calls < max_calls:
            mid = (lo + hi) // 2
            if ask(RangeSpec(r.topic, r.partition, lo, mid)):
                hi = mid
            else:
                lo = mid
        if hi - lo == 1:
            return (r.topic, r.partition, lo)
        return None
    return None


def locate_poison(
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    ranges: list[RangeSpec],
    max_jobs: int = MAX_POISON_JOBS,
    *,
    exclude: Collection[tuple[str, int, int]] = (),
    time_filter: tuple[int, int] | None = None,
) -> tuple[str, int, int] | None:
    """The first record the transform fails on, found with bounded Spark jobs (None when the
    failure does not reproduce on a sub-range or the job budget runs out). Records at the
    ``exclude`` positions (dead letters already found) are left out of every job."""

    return first_failing_offset(
        ranges,
        lambda r: _job_error(spark, pipeline, transform, r, exclude, time_filter) is not None,
        max_jobs,
    )


def record_error(
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    position: tuple[str, int, int],
) -> str:
    """The transform's error on the one record at ``position`` (its telling line), for the
    dead letter's ``eo.error`` header."""
    topic, partition, offset = position
    exc = _job_error(spark, pipeline, transform, RangeSpec(topic, partition, offset, offset + 1))
    return short_error(exc) if exc is not None else "the transform failed on this record"


def job_failure(
    exc: BaseException,
    *,
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    live: list[RangeSpec],
    where: str,
    exclude: Collection[tuple[str, int, int]] = (),
    time_filter: tuple[int, int] | None = None,
) -> PrepareError | KafkaAccessDenied:
    """The error to raise for a failed Spark job: a :class:`KafkaAccessDenied` when the
    Kafka source was refused by the broker's ACLs, a :class:`SparkEnvironmentError` when the
    executors' environment failed (no record searched for or blamed), a
    :class:`TransformError` naming the poison record when the user's code failed on one
    record (or saying it fails on the first and the last record alike), else a
    :class:`PrepareError` with the job's reason."""
    message = short_error(exc)
    denied = java_access_denied(str(exc), f"{where}: Spark's Kafka source", config=pipeline.kafka)
    if denied is not None:
        return denied
    advice = environment_failure(exc)
    if advice is not None:
        return SparkEnvironmentError(
            f"{where}: the Spark job failed in the executors' environment, not on a record: "
            f"{message}. Nothing was published; {advice}, then retry the prepare."
        )
    if is_transform_failure(exc):
        poison = locate_poison(spark, pipeline, transform, live, exclude=exclude, time_filter=time_filter)
        if poison is not None and fails_on_last_too(spark, pipeline, transform, live, poison):
            last = live[-1]
            return TransformError(
                f"{where}: transform {pipeline.transform!r} fails on the first record "
                f"({poison[0]}[{poison[1]}] offset {poison[2]}) and on the last "
                f"({last.topic}[{last.partition}] offset {last.end - 1}) alike: {message}. "
                "Most likely a bug in the transform's code (or its environment), not a bad "
                "record. Nothing was published; fix the transform and retry the prepare."
            )
        at = f" at {poison[0]}[{poison[1]}] offset {poison[2]}" if poison else ""
        return TransformError(
            f"{where}: transform {pipeline.transform!r} failed{at}: {message}. Nothing was "
            "published; fix the transform (or the record) and retry the prepare."
        )
    return PrepareError(f"{where}: the Spark job failed: {message}")


def fails_on_last_too(
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    live: list[RangeSpec],
    poison: tuple[str, int, int],
) -> bool:
    """Whether a failure pinned on the very first record also happens on the last record
    (one more bounded Spark job, only in that case)."""
    first = next((r for r in live if r.end > r.start), None)
    last = next((r for r in reversed(live) if r.end > r.start), None)
    if first is None or last is None or poison != (first.topic, first.partition, first.start):
        return False
    if (last.topic, last.partition, last.end - 1) == poison:
        return False  # one record only: nothing else to compare with
    probe = RangeSpec(last.topic, last.partition, last.end - 1, last.end)
    failing = first_failing_offset([probe], lambda r: _job_error(spark, pipeline, transform, r) is not None)
    return failing is not None


def _job_error(
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    r: RangeSpec,
    exclude: Collection[tuple[str, int, int]] = (),
    time_filter: tuple[int, int] | None = None,
) -> Exception | None:
    """The transform's failure on the records of ``r`` (one bounded Spark job), None when it
    succeeds."""
    from airflow_provider_eo.spark.source import read_ranges, without_positions

    src = read_ranges(spark, pipeline, [r], time_filter=time_filter)
    src = with_provenance(without_positions(src, [p for p in exclude if p[:2] == (r.topic, r.partition)]))
    try:
        transform(src).write.format("noop").mode("overwrite").save()
    except Exception as exc:
        return exc
    return None
