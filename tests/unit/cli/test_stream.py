"""``eo stream``: a refused setting is named as its flag, before anything is loaded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from airflow_provider_eo import cli


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--commit", "later"], "error: --commit must be one of inline, airflow, got 'later'"),
        (["--duration", "1", "--checkpoints", "2"], "error: give --duration or --checkpoints, not both"),
        (["--interval", "0"], "error: --interval must be > 0 seconds, got 0.0"),
        (["--heartbeat", "-1"], "error: --heartbeat must be > 0 seconds, got -1.0"),
        (["--checkpoints", "0"], "error: --checkpoints must be >= 1, got 0"),
    ],
)
def test_a_refused_setting_exits_1_naming_the_flag(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.app, ["stream", "no.such.module:PIPE", *argv])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == message  # nothing loaded: no "ledger: ..." line
