"""The Airflow demo outside a source checkout, and the demo package's import boundaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_provider_eo import cli
from airflow_provider_eo.demo import airflow as airflow_demo
from airflow_provider_eo.errors import EoError
from airflow_provider_eo.stack import paths


def _installed_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an installed wheel sees: a project root without the checkout's ``dags/``."""
    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)


def test_dags_source_names_what_is_missing_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed_wheel(tmp_path, monkeypatch)
    with pytest.raises(airflow_demo.DemoNeedsCheckout) as info:
        airflow_demo.dags_source()
    message = str(info.value)
    assert isinstance(info.value, EoError)
    assert "eo_pipeline.py, eo_demo_pipelines.py are not in" in message
    assert str(tmp_path / "dags") in message
    assert "source checkout" in message and "make demo" in message
    assert "eo demo --no-airflow" in message


def test_dags_source_reports_only_the_missing_file(tmp_path: Path) -> None:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "eo_pipeline.py").write_text("")
    with pytest.raises(airflow_demo.DemoNeedsCheckout, match=r"eo_demo_pipelines.py is not in"):
        airflow_demo.dags_source(tmp_path)
    (tmp_path / "dags" / "eo_demo_pipelines.py").write_text("")
    assert airflow_demo.dags_source(tmp_path) == tmp_path / "dags"


def test_the_checkout_has_the_example_dags() -> None:
    assert airflow_demo.dags_source(Path(__file__).resolve().parents[3]).name == "dags"


def test_eo_demo_without_checkout_fails_with_the_message_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed_wheel(tmp_path, monkeypatch)

    def no_broker(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the demo started the broker before checking for the DAGs")

    from airflow_provider_eo.stack import kafka

    monkeypatch.setattr(kafka.LocalKafka, "up", no_broker)
    result = CliRunner().invoke(cli.app, ["demo"])
    assert result.exit_code == 1
    assert not isinstance(result.exception, FileNotFoundError)
    text = " ".join(result.output.split())
    assert "error:" in text and "needs a source checkout" in text
    assert "eo demo --no-airflow" in text


def test_demo_package_never_imports_the_cli() -> None:
    code = (
        "import sys\n"
        "import airflow_provider_eo.demo.airflow, airflow_provider_eo.demo.direct\n"
        "import airflow_provider_eo.render, airflow_provider_eo.demo.sample\n"
        "assert 'airflow_provider_eo.cli' not in sys.modules, 'demo imported the CLI'\n"
        "assert 'airflow' not in sys.modules, 'the demo parent must never import Airflow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_imports_no_demo_module_at_import_time() -> None:
    code = (
        "import sys\n"
        "import airflow_provider_eo.cli\n"
        "assert not [m for m in sys.modules if m.startswith('airflow_provider_eo.demo')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
