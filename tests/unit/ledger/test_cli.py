from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from airflow_provider_eo.cli import app
from airflow_provider_eo.cli import ledger as cli_ledger
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.render import checkpoints_table


def _seed(ledger: Ledger) -> None:
    ledger.plan("orders", [RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 3, 5)])
    ledger.mark_prepared(
        "orders", 1, attempt="a", staging_location="/s", records=12, bytes_=10, shard_counts={0: 12}
    )
    ledger.mark_committed("orders", 1)
    ledger.plan("orders", [RangeSpec("t", 0, 10, 20)])


def test_checkpoints_table_and_json(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(ledger)
    # The command's console reads COLUMNS when the CLI module is imported, which may be
    # before this test (a pytest-xdist worker sets COLUMNS=80): give it a wide one here.
    monkeypatch.setattr(cli_ledger, "_out", Console(width=200))
    runner = CliRunner()
    url = ledger.engine.url.render_as_string(hide_password=False)
    result = runner.invoke(app, ["checkpoints", "orders", "--ledger-url", url])
    assert result.exit_code == 0, result.output
    assert "COMMITTED" in result.output and "t[0]:0-10, t[1]:3-5" in result.output
    assert "PLANNED" in result.output
    result = runner.invoke(app, ["checkpoints", "orders", "--ledger-url", url, "--json"])
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["checkpoint_id"], r["state"], r["records"]) for r in rows] == [
        (1, "COMMITTED", 12),
        (2, "PLANNED", None),
    ]
    result = runner.invoke(app, ["pipelines", "--ledger-url", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "orders" in result.output


def test_cli_errors_are_readable(ledger: Ledger) -> None:
    result = CliRunner().invoke(
        app, ["checkpoints", "nope", "--ledger-url", ledger.engine.url.render_as_string(hide_password=False)]
    )
    assert result.exit_code == 1
    assert "pipeline 'nope' is not in the ledger" in result.output


def test_upgrade_cmd_uses_env_url(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'new.db'}"
    monkeypatch.setenv("EO_LEDGER_URL", url)
    result = CliRunner().invoke(app, ["ledger", "upgrade"])
    assert result.exit_code == 0, result.output
    assert Ledger(url, create=False).current_revision() == Ledger(url, create=False).head_revision()


def test_render_table(ledger: Ledger) -> None:
    _seed(ledger)
    console = Console(width=200, record=True)
    console.print(checkpoints_table(ledger.list_checkpoints("orders")))
    text = console.export_text()
    assert "plan→prepare" in text and "t[0]:10-20" in text


def test_a_querys_batches_show_their_batch_ids(ledger: Ledger) -> None:
    ledger.ensure_pipeline("agg", "f")
    ledger.plan("agg", [RangeSpec("t", 0, 0, 5)], batch=("q1", 7))
    console = Console(width=200, record=True)
    console.print(checkpoints_table(ledger.list_checkpoints("agg")))
    header, *rows = [line for line in console.export_text().splitlines() if "│" in line or "┃" in line]
    assert "batch" in header and any(" 7 " in row for row in rows)
    result = CliRunner().invoke(
        app,
        [
            "checkpoints",
            "agg",
            "--json",
            "--ledger-url",
            ledger.engine.url.render_as_string(hide_password=False),
        ],
    )
    row = json.loads(result.stdout.splitlines()[0])
    assert (row["query_id"], row["batch_id"]) == ("q1", 7)
    console = Console(width=200, record=True)
    _seed(ledger)
    console.print(checkpoints_table(ledger.list_checkpoints("orders")))
    assert "batch" not in console.export_text()  # a pipeline's own checkpoints: no column
