"""``eo savepoint create`` on a Structured Streaming sink: the flags that belong to eo's own
pipelines or to a sink are refused on the other kind, before the ledger is opened."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_provider_eo import cli

MODULE = """
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.streaming import KafkaExactlyOnceSink

SINK = KafkaExactlyOnceSink(name="agg", kafka={{"bootstrap.servers": "127.0.0.1:1"}}, sink_topic="agg",
                            ledger_url="sqlite:///{ledger}")
PIPE = Pipeline(name="orders", kafka={{"bootstrap.servers": "127.0.0.1:1"}}, source_topics=["o"],
                sink_topic="out", ledger_url="sqlite:///{ledger}")
"""


@pytest.fixture()
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"eo_cli_sp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODULE.format(ledger=tmp_path / "ledger.db"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_stop_is_refused_for_a_sink_and_copy_for_a_pipeline(module: str, tmp_path: Path) -> None:
    stop = CliRunner().invoke(cli.app, ["savepoint", "create", f"{module}:SINK", "sp", "--stop"])
    assert stop.exit_code == 1, stop.output
    said = " ".join(stop.stderr.split())  # the console wraps long lines
    assert "--stop is for eo's own pipelines; stop the query first (`eo stream-stop" in said
    copy = CliRunner().invoke(
        cli.app, ["savepoint", "create", f"{module}:PIPE", "sp", "--copy-checkpoint-to", str(tmp_path / "c")]
    )
    assert copy.exit_code == 1, copy.output
    assert "are for a KafkaExactlyOnceSink" in " ".join(copy.stderr.split())
    assert not (tmp_path / "ledger.db").exists()  # refused before the ledger was opened
