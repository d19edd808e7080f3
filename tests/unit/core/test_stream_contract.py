"""core/stream_contract.py: the streaming application's arguments and report, the one check
of the streaming settings."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_eo.core.stream_contract import (
    COMMIT_MODES,
    StreamAppArgs,
    StreamArgsError,
    StreamFailure,
    StreamReport,
    StreamReportWriter,
    check_stream_settings,
)
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Actor

optional_text = st.none() | st.text()
finite = st.floats(allow_nan=False, allow_infinity=False)
actors = st.none() | st.builds(
    Actor,
    dag_id=optional_text,
    run_id=optional_text,
    task_id=optional_text,
    try_number=st.none() | st.integers(),
    hostname=optional_text,
    pid=st.none() | st.integers(),
)
# duration | checkpoints | neither: the application refuses both.
bounds = st.one_of(
    st.just((None, None)),
    st.tuples(finite, st.none()),
    st.tuples(st.none(), st.integers()),
)


@given(
    pipeline=st.text(),
    interval=finite,
    commit=st.sampled_from(COMMIT_MODES),
    bound=bounds,
    actor=actors,
    report_file=optional_text,
    run_id=optional_text,
    heartbeat=finite,
    log_path=optional_text,
)
def test_to_argv_and_from_argv_round_trip(
    pipeline: str,
    interval: float,
    commit: Any,
    bound: tuple[float | None, int | None],
    actor: Actor | None,
    report_file: str | None,
    run_id: str | None,
    heartbeat: float,
    log_path: str | None,
) -> None:
    args = StreamAppArgs(
        pipeline=pipeline,
        interval=interval,
        commit=commit,
        duration=bound[0],
        checkpoints=bound[1],
        actor=actor,
        report_file=report_file,
        run_id=run_id,
        heartbeat=heartbeat,
        log_path=log_path,
    )
    assert StreamAppArgs.from_argv(args.to_argv()) == args


def test_the_argv_is_the_applications_stable_interface() -> None:
    """The flags an operator of any version passes; a new field must not change these."""
    assert StreamAppArgs("m:P", interval=2, checkpoints=3).to_argv() == [
        "--pipeline", "m:P", "--interval", "2.0", "--commit", "inline", "--checkpoints", "3",
    ]  # fmt: skip
    detached = StreamAppArgs(
        "m:P", commit="airflow", duration=9, run_id="r1", heartbeat=2.5, log_path="/l/r1.log"
    )
    assert detached.to_argv() == [
        "--pipeline", "m:P", "--interval", "5.0", "--commit", "airflow", "--duration", "9.0",
        "--run-id", "r1", "--heartbeat", "2.5", "--log-path", "/l/r1.log",
    ]  # fmt: skip
    actor = Actor(dag_id="d", run_id="r", task_id="t", try_number=2)
    assert StreamAppArgs("m:P", actor=actor).to_argv()[-2:] == [
        "--actor-json",
        '{"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": 2}',
    ]


def test_an_older_operators_argv_parses() -> None:
    client = [
        "--pipeline", "m:P", "--interval", "1.0", "--commit", "inline", "--checkpoints", "2",
        "--report-file", "/tmp/r.jsonl",
        "--actor-json", '{"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": 1}',
    ]  # fmt: skip
    assert StreamAppArgs.from_argv(client) == StreamAppArgs(
        "m:P",
        interval=1.0,
        checkpoints=2,
        report_file="/tmp/r.jsonl",
        actor=Actor(dag_id="d", run_id="r", task_id="t", try_number=1),
    )
    detached = [
        "--pipeline", "m:P", "--interval", "5.0", "--commit", "airflow",
        "--run-id", "r1", "--heartbeat", "5.0", "--log-path", "/l.log",
    ]  # fmt: skip
    assert StreamAppArgs.from_argv(detached) == StreamAppArgs(
        "m:P", commit="airflow", run_id="r1", log_path="/l.log"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval", "1"],  # no --pipeline
        ["--pipeline", "m:P", "--commit", "later"],
        ["--pipeline", "m:P", "--duration", "1", "--checkpoints", "2"],
    ],
)
def test_a_malformed_argv_exits_2_like_any_argparse_program(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        StreamAppArgs.from_argv(argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("settings", "message", "cli_message"),
    [
        (
            {"commit": "later"},
            "commit must be one of ('inline', 'airflow'), got 'later'",
            "--commit must be one of inline, airflow, got 'later'",
        ),
        (
            {"duration": 1.0, "checkpoints": 1},
            "give duration or checkpoints, not both",
            "give --duration or --checkpoints, not both",
        ),
        (
            {"interval": 0.0},
            "interval must be > 0 seconds, got 0.0",
            "--interval must be > 0 seconds, got 0.0",
        ),
        (
            {"heartbeat": -1.0},
            "heartbeat must be > 0 seconds, got -1.0",
            "--heartbeat must be > 0 seconds, got -1.0",
        ),
        ({"checkpoints": 0}, "checkpoints must be >= 1, got 0", "--checkpoints must be >= 1, got 0"),
        # the first refused setting, in the order of eo stream's flags
        (
            {"commit": "later", "interval": 0.0},
            "commit must be one of ('inline', 'airflow'), got 'later'",
            "--commit must be one of inline, airflow, got 'later'",
        ),
        (
            {"interval": 0.0, "duration": 1.0, "checkpoints": 1},
            "give duration or checkpoints, not both",
            "give --duration or --checkpoints, not both",
        ),
        (
            {"interval": 0.0, "heartbeat": 0.0},
            "interval must be > 0 seconds, got 0.0",
            "--interval must be > 0 seconds, got 0.0",
        ),
    ],
)
def test_validate_refuses_each_impossible_setting(
    settings: dict[str, Any], message: str, cli_message: str
) -> None:
    with pytest.raises(StreamArgsError) as info:
        StreamAppArgs("m:P", **settings).validate()
    assert str(info.value) == message and info.value.cli_message == cli_message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    with pytest.raises(StreamArgsError, match="^" + re.escape(message)):
        check_stream_settings(**settings)


def test_valid_settings_pass() -> None:
    args = StreamAppArgs("m:P", interval=0.1, commit="airflow", checkpoints=1, heartbeat=0.5)
    assert args.validate() is args
    check_stream_settings()
    check_stream_settings(duration=0.0)  # a zero duration is a run that stops at once


def _failure() -> StreamFailure:
    try:
        raise RuntimeError("injected fault at prepare.after_write")
    except RuntimeError as exc:
        return StreamFailure.of(exc)


def test_the_failure_line_names_the_exception_and_keeps_the_traceback_tail() -> None:
    failure = _failure()
    assert failure.error == "RuntimeError: injected fault at prepare.after_write"
    assert failure.traceback[0] == "Traceback (most recent call last):"
    assert failure.traceback[-1] == "RuntimeError: injected fault at prepare.after_write"
    try:
        raise RuntimeError("\n".join(f"line {i}" for i in range(40)))
    except RuntimeError as exc:
        long = StreamFailure.of(exc)
    assert len(long.traceback) == 20 and long.traceback[-1] == "line 39"


def test_the_writer_prints_and_appends_every_line_and_parse_reads_them_back(tmp_path: Path) -> None:
    path = tmp_path / "report.jsonl"
    out = io.StringIO()
    checkpoint = {"checkpoint": 1, "records": 7, "prepare_s": 0.5, "commit_s": None, "state": "PREPARED"}
    summary = {"pipeline": "p", "commit": "airflow", "checkpoints": 1, "records": 7, "reason": "checkpoints"}
    failure = _failure()
    with StreamReportWriter(str(path), out=out) as writer:
        writer.checkpoint(checkpoint)
        writer.summary(summary)
        writer.failure(failure)
    lines = path.read_text().splitlines()
    assert lines == out.getvalue().splitlines()
    assert json.loads(lines[2]) == {"error": failure.error, "traceback": list(failure.traceback)}
    report = StreamReport.read(path)
    assert report == StreamReport((checkpoint,), summary, failure)
    assert StreamReport.parse(report.lines()) == report


def test_without_a_file_the_writer_only_prints() -> None:
    out = io.StringIO()
    with StreamReportWriter(None, out=out) as writer:
        writer.checkpoint({"checkpoint": 1, "records": 0})
    assert out.getvalue() == '{"checkpoint": 1, "records": 0}\n'


def test_a_summary_without_its_counts_is_refused() -> None:
    """parse tells the summary from a checkpoint's line by its counts."""
    with StreamReportWriter(None, out=io.StringIO()) as writer, pytest.raises(ValueError, match="counts"):
        writer.summary({"checkpoint": 1, "records": 3})


def test_parse_skips_noise_and_a_torn_last_line() -> None:
    lines = [
        "INFO SparkContext: Running Spark version 4.0.0",
        '{"checkpoint": 1, "records": 3}',
        '{"pipeline": "p", "checkpoints": 1, "records": 3, "reason": "duration"}',
        "[1, 2]",
        '  {"checkpoint": 2, "records": 4}  ',
        '{"pipeline": "p", "checkpoints": 2, "records": 7, "reason": "checkpoints"}',
        "INFO SparkContext: Successfully stopped SparkContext",
        '{"error": "RuntimeError: boom", "traceback": ["Traceback (most recent call last):"]}',
        '{"checkpoint": 3, "rec',  # cut by a SIGKILL
    ]
    report = StreamReport.parse(lines)
    assert [c["checkpoint"] for c in report.checkpoints] == [1, 2]
    assert report.summary == {"pipeline": "p", "checkpoints": 2, "records": 7, "reason": "checkpoints"}
    assert report.failure == StreamFailure("RuntimeError: boom", ("Traceback (most recent call last):",))
    assert StreamReport.parse(['{"checkpoint": 1, "records": 3}']).summary is None
    assert StreamReport.parse(['{"error": "Killed"}']).failure == StreamFailure("Killed")


def test_no_report_file_is_an_empty_report(tmp_path: Path) -> None:
    assert StreamReport.read(None) == StreamReport()
    assert StreamReport.read(tmp_path / "missing.jsonl") == StreamReport()
