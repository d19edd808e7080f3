"""cli/errors.py: the one mapping from an error to a message and an exit code."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from airflow_provider_eo import cli
from airflow_provider_eo.cli import run as run_commands
from airflow_provider_eo.cli.errors import EXIT_STOPPED, reported
from airflow_provider_eo.errors import CommitError, EoError, PipelineStopped
from airflow_provider_eo.ledger.errors import LedgerError


def _exit_code(error: BaseException, **kwargs: Any) -> int:
    with pytest.raises(typer.Exit) as info, reported(**kwargs):
        raise error
    return info.value.exit_code


def test_a_user_error_exits_1_and_prints_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(CommitError("checkpoint 7 of 'orders' is fenced; rerun it")) == 1
    assert "error: checkpoint 7 of 'orders' is fenced; rerun it" in capsys.readouterr().err


def test_a_stopped_pipeline_exits_with_the_code_asked_for() -> None:
    stopped = PipelineStopped.of("orders", stopped_by="me", stopped_at=None, reason="maintenance")
    assert _exit_code(stopped, stopped=EXIT_STOPPED) == 3
    assert _exit_code(stopped) == 1


def test_narrowed_to_ledger_errors_other_errors_pass_through() -> None:
    assert _exit_code(LedgerError("no such pipeline"), errors=LedgerError) == 1
    with pytest.raises(CommitError), reported(LedgerError):
        raise CommitError("not a ledger error")
    with pytest.raises(PipelineStopped), reported(LedgerError, stopped=EXIT_STOPPED):
        raise PipelineStopped("stopped")


def test_bugs_and_exits_pass_through_unchanged() -> None:
    with pytest.raises(KeyError), reported():
        raise KeyError("a bug keeps its traceback")
    with pytest.raises(typer.Exit) as info, reported():
        raise typer.Exit(2)
    assert info.value.exit_code == 2
    with reported():
        pass


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (PipelineStopped.of("orders", stopped_by="me", stopped_at=None, reason="maintenance"), 3),
        (EoError("pipeline 'orders': broker unreachable"), 1),
    ],
)
def test_eo_run_once_exit_codes(monkeypatch: pytest.MonkeyPatch, error: EoError, code: int) -> None:
    def load(ref: str) -> Any:
        raise error

    monkeypatch.setattr(run_commands, "load", load)
    result = CliRunner().invoke(cli.app, ["run-once", "mod:PIPE"])
    assert result.exit_code == code, result.output
    assert f"error: {error}" in " ".join(result.stderr.split())
