"""The prepare and commit applications' command lines (apps/args.py): what the operators
build is what the applications read back, flag for flag."""

from __future__ import annotations

import pytest

from airflow_provider_eo.apps.args import CommitAppArgs, PrepareAppArgs
from airflow_provider_eo.ledger import Actor

_ACTOR = Actor(dag_id="d", run_id="r", task_id="t", try_number=2, hostname="h", pid=7)


def test_prepare_argv_is_the_operators_command_line() -> None:
    assert PrepareAppArgs("m:P", 7).to_argv() == ["--pipeline", "m:P", "--checkpoint", "7"]
    backfill = PrepareAppArgs("m:P", 7, backfill_sink_topic="out.bf", backfill_transform="m:fn")
    assert backfill.to_argv()[4:] == ["--backfill-sink-topic", "out.bf", "--backfill-transform", "m:fn"]


@pytest.mark.parametrize(
    "args",
    [
        PrepareAppArgs("m:P", 7),
        PrepareAppArgs(
            "m:P",
            8,
            attempt="a1",
            actor=_ACTOR,
            kafka_conn_id="k",
            ledger_conn_id="l",
            backfill_sink_topic="out.bf",
            backfill_transform="m:fn",
        ),
    ],
)
def test_prepare_args_read_back_equal(args: PrepareAppArgs) -> None:
    assert PrepareAppArgs.from_argv(args.to_argv()) == args


def test_prepare_reads_what_configure_submit_appends() -> None:
    """The operator appends the connection ids and --actor-json after the object's flags."""
    argv = [*PrepareAppArgs("m:P", 3).to_argv(), "--ledger-conn-id", "l", "--actor-json", '{"dag_id": "d"}']
    read = PrepareAppArgs.from_argv(argv)
    assert (read.ledger_conn_id, read.actor) == ("l", Actor(dag_id="d"))


def test_a_backfill_transform_without_its_topic_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        PrepareAppArgs.from_argv(["--pipeline", "m:P", "--checkpoint", "1", "--backfill-transform", "m:fn"])
    assert exited.value.code == 2
    assert "--backfill-transform needs --backfill-sink-topic" in capsys.readouterr().err


def test_commit_argv_is_the_operators_command_line() -> None:
    assert CommitAppArgs("m:P", 4).to_argv() == ["--pipeline", "m:P", "--checkpoint", "4"]
    assert CommitAppArgs("m:P", 4, summary_file="/s.json").to_argv()[4:] == ["--summary-file", "/s.json"]


def test_commit_args_read_back_equal() -> None:
    args = CommitAppArgs(
        "m:P", 9, summary_file="/s.json", actor=_ACTOR, kafka_conn_id="k", ledger_conn_id="l"
    )
    assert CommitAppArgs.from_argv(args.to_argv()) == args
    assert CommitAppArgs.from_argv(CommitAppArgs("m:P", 9).to_argv()) == CommitAppArgs("m:P", 9)


def test_a_commit_without_checkpoint_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        CommitAppArgs.from_argv(["--pipeline", "m:P"])
    assert exited.value.code == 2
