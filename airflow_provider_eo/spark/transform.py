"""The user's transform: loading it, telling its failures from the environment's, and
finding the first record it fails on (the poison-record search).

Only a failure raised by the user's code (a Python UDF, a Spark expression) counts as bad
data and starts the search; Kafka or filesystem failures are reported as such.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_provider_eo.errors import PrepareError, TransformError
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark.source import kafka_source, with_provenance

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
) -> tuple[str, int, int] | None:
    """The first record the transform fails on, found with bounded Spark jobs (None when the
    failure does not reproduce on a sub-range or the job budget runs out)."""

    def fails(r: RangeSpec) -> bool:
        src = with_provenance(kafka_source(spark, pipeline, [r]))
        try:
            transform(src).write.format("noop").mode("overwrite").save()
        except Exception:
            return True
        return False

    return first_failing_offset(ranges, fails, max_jobs)


def job_failure(
    exc: BaseException,
    *,
    spark: SparkSession,
    pipeline: Pipeline,
    transform: Transform,
    live: list[RangeSpec],
    where: str,
) -> PrepareError:
    """The error to raise for a failed Spark job: a :class:`TransformError` naming the poison
    record when the user's code failed, else a :class:`PrepareError` with the job's reason."""
    message = short_error(exc)
    if is_transform_failure(exc):
        poison = locate_poison(spark, pipeline, transform, live)
        at = f" at {poison[0]}[{poison[1]}] offset {poison[2]}" if poison else ""
        return TransformError(
            f"{where}: transform {pipeline.transform!r} failed{at}: {message}. Nothing was "
            "published; fix the transform (or the record) and retry the prepare."
        )
    return PrepareError(f"{where}: the Spark job failed: {message}")
