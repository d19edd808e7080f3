"""Loading the transform, telling its failures apart, and the poison-record bisection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_eo.errors import PrepareError, TransformError
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.spark import transform


def test_load_transform_identity_and_reference() -> None:
    assert transform.load_transform(None)("df") == "df"  # type: ignore[arg-type]
    fn = transform.load_transform("os.path:basename")
    assert fn("/a/b") == "b"  # type: ignore[arg-type,comparison-overlap]


@pytest.mark.parametrize("ref", ["no_such_module_eo:fn", "os.path:no_such_fn", "os.path:sep", "os.path"])
def test_load_transform_refuses_bad_references(ref: str) -> None:
    with pytest.raises(PrepareError, match="transform"):
        transform.load_transform(ref)


def test_apply_transform_wraps_plan_time_errors() -> None:
    def broken(df: object) -> object:
        raise KeyError("no column x")

    with pytest.raises(TransformError, match=r"pipeline 'p', checkpoint 3: transform 'm:f' raised"):
        transform.apply_transform(broken, "df", ref="m:f", where="pipeline 'p', checkpoint 3")  # type: ignore[arg-type]

    def refuses(df: object) -> object:
        raise PrepareError("own message")

    with pytest.raises(PrepareError, match=r"^own message$"):
        transform.apply_transform(refuses, "df", ref="m:f", where="w")  # type: ignore[arg-type]


def test_short_error_keeps_the_python_error_line() -> None:
    exc = RuntimeError(
        "Job aborted.\n  at org.apache.spark...\nValueError: bad record\n\n  at py4j.Gateway\n"
    )
    assert transform.short_error(exc) == "ValueError: bad record"
    assert transform.short_error(RuntimeError("")) == "RuntimeError"
    assert transform.short_error(RuntimeError("plain\nlast line")) == "last line"


def test_is_transform_failure() -> None:
    assert transform.is_transform_failure(RuntimeError("... PythonException: boom"))
    assert transform.is_transform_failure(RuntimeError("[DIVIDE_BY_ZERO] SparkArithmeticException"))
    assert not transform.is_transform_failure(RuntimeError("TimeoutException: Kafka broker unreachable"))


def _fails_from(bad: set[tuple[str, int, int]], asked: list[RangeSpec]):  # type: ignore[no-untyped-def]
    def fails(r: RangeSpec) -> bool:
        asked.append(r)
        return any(t == r.topic and p == r.partition and r.start <= o < r.end for t, p, o in bad)

    return fails


def test_bisection_names_the_first_failing_offset() -> None:
    ranges = [RangeSpec("a", 0, 0, 100), RangeSpec("a", 1, 50, 1050), RangeSpec("a", 2, 0, 9)]
    asked: list[RangeSpec] = []
    found = transform.first_failing_offset(ranges, _fails_from({("a", 1, 777), ("a", 2, 3)}, asked))
    assert found == ("a", 1, 777)
    assert len(asked) <= 2 + 10  # two whole ranges, then log2(1000) halvings


def test_bisection_skips_empty_ranges_and_finds_nothing_when_all_pass() -> None:
    asked: list[RangeSpec] = []
    ranges = [RangeSpec("a", 0, 5, 5), RangeSpec("a", 1, 0, 4)]
    assert transform.first_failing_offset(ranges, _fails_from(set(), asked)) is None
    assert asked == [RangeSpec("a", 1, 0, 4)]


def test_bisection_gives_up_when_the_budget_runs_out() -> None:
    asked: list[RangeSpec] = []
    ranges = [RangeSpec("a", 0, 0, 1 << 20)]
    found = transform.first_failing_offset(ranges, _fails_from({("a", 0, 12345)}, asked), max_calls=5)
    assert found is None and len(asked) == 5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "PythonException: ... ModuleNotFoundError: No module named 'acme.transforms'",
            "module 'acme.transforms' is not importable on the executors: ship the transform's module",
        ),
        ("ImportError: cannot import name 'x' from 'y'", "ship the transform's module"),
        ("Python in worker has different version 3.10 than that in driver 3.11", "same Python"),
        ('java.io.IOException: Cannot run program "python3.11": error=2', "install the Python"),
        ("_pickle.PicklingError: Could not serialize object: TypeError", "picklable"),
    ],
)
def test_environment_failures_are_told_apart(text: str, expected: str) -> None:
    advice = transform.environment_failure(RuntimeError(text))
    assert advice is not None and expected in advice


@pytest.mark.parametrize(
    "text",
    [
        "PythonException: ValueError: cannot parse record: POISON",
        "[DIVIDE_BY_ZERO] SparkArithmeticException",
        "TimeoutException: Kafka broker unreachable",
    ],
)
def test_record_and_kafka_failures_are_not_environment_failures(text: str) -> None:
    assert transform.environment_failure(RuntimeError(text)) is None


def test_environment_failure_reads_a_huge_error_text_in_linear_time() -> None:
    """A job's error may quote a large record (a run of megabytes of word characters): the
    patterns read it at once, and still find the name at either end. Run in a child process
    so a regression (quadratic backtracking: hours for this text) fails by its timeout."""
    code = (
        "from airflow_provider_eo.spark.transform import environment_failure\n"
        "blob = 'x' * 1_500_000\n"
        "assert environment_failure(RuntimeError(blob)) is None\n"
        "hit = environment_failure(RuntimeError(blob + ' TopicAuthorizationException: no'))\n"
        "assert hit is not None and 'eo doctor --acls' in hit, hit\n"
        "hit = environment_failure(RuntimeError('ImportError: x ' + blob))\n"
        "assert hit is not None and 'py_files' in hit, hit\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
