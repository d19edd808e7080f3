from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from airflow_provider_eo.cli import app
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Ledger, default_ledger_url, redact_url
from airflow_provider_eo.ledger.urls import describe_ledger_url, redact_text, resolve_ledger_url
from airflow_provider_eo.paths import checkout_root, eo_home


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://eo:s3cr%40t@db:5432/eo", "postgresql+psycopg://eo:***@db:5432/eo"),
        ("postgresql+psycopg://eo@db/eo", "postgresql+psycopg://eo@db/eo"),
        ("sqlite:///.eo/ledger.db", "sqlite:///.eo/ledger.db"),
        ("not a url://u:pw@h", "not a url://u:***@h"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_masks_the_password_anywhere() -> None:
    url = "postgresql+psycopg://eo:s3cr%40t@db/eo"
    assert redact_text("auth failed for s3cr@t", url) == "auth failed for ***"


def test_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EO_LEDGER_URL", raising=False)
    assert default_ledger_url() == "sqlite:///ledger.db"
    monkeypatch.setenv("EO_LEDGER_URL", "sqlite:////tmp/x.db")
    assert default_ledger_url() == "sqlite:////tmp/x.db"


@pytest.fixture()
def two_cwds(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "cwd-a", tmp_path / "cwd-b" / "deeper"
    a.mkdir()
    b.mkdir(parents=True)
    return a, b


@pytest.mark.parametrize("url", ["sqlite:///ledger.db", "sqlite:///eo-ledger.db", "sqlite:///sub/l.db"])
def test_relative_sqlite_resolves_against_eo_home_whatever_the_cwd(
    url: str, tmp_path: Path, two_cwds: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("EO_HOME", str(home))
    seen = set()
    for cwd in two_cwds:
        monkeypatch.chdir(cwd)
        seen.add(resolve_ledger_url(url))
    assert seen == {f"sqlite:///{home / url.removeprefix('sqlite:///')}"}


def test_without_eo_home_a_checkout_uses_its_dot_eo(
    two_cwds: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EO_HOME", raising=False)
    root = checkout_root()
    assert root is not None  # the tests run from the source checkout
    for cwd in two_cwds:
        monkeypatch.chdir(cwd)
        assert eo_home() == root / ".eo"
        assert resolve_ledger_url("sqlite:///ledger.db") == f"sqlite:///{root / '.eo' / 'ledger.db'}"


def test_relative_eo_home_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_HOME", "relative/home")
    with pytest.raises(ConfigError, match="absolute"):
        eo_home()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////abs/ledger.db",
        "sqlite://",
        "sqlite:///:memory:",
        "postgresql+psycopg://eo:pw@db/eo",
        "sqlite:///file:x.db?mode=ro&uri=true",
    ],
)
def test_other_urls_are_unchanged(url: str) -> None:
    assert resolve_ledger_url(url) == url


def test_home_tilde_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_ledger_url("sqlite:///~/l.db") == f"sqlite:///{tmp_path / 'l.db'}"


def test_the_ledger_opens_the_resolved_file(
    tmp_path: Path, two_cwds: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ledgers opened from two working directories are one file: a pipeline registered
    from the first is seen from the second (today's bug: two files, the second empty)."""
    monkeypatch.setenv("EO_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(two_cwds[0])
    with Ledger("sqlite:///ledger.db") as first:
        first.ensure_pipeline("orders", "f1")
        identity = first.get_pipeline("orders").identity
    monkeypatch.chdir(two_cwds[1])
    with Ledger("sqlite:///ledger.db") as second:
        assert second.get_pipeline("orders").identity == identity
    assert (tmp_path / "home" / "ledger.db").is_file()
    assert not any(p.name == "ledger.db" for cwd in two_cwds for p in cwd.rglob("*"))


def test_cli_says_which_ledger_file_it_uses(
    tmp_path: Path, two_cwds: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("EO_HOME", str(home))
    monkeypatch.delenv("EO_LEDGER_URL", raising=False)
    with Ledger(f"sqlite:///{home / 'ledger.db'}") as ledger:
        ledger.ensure_pipeline("orders", "f1")
    for cwd in two_cwds:
        monkeypatch.chdir(cwd)
        result = CliRunner().invoke(app, ["pipelines"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert f"ledger: sqlite:///{home / 'ledger.db'}" in result.stderr
        assert "orders" in result.stdout
        result = CliRunner().invoke(app, ["checkpoints", "orders", "--json"])
        assert result.exit_code == 0, result.output
        assert f"ledger: sqlite:///{home / 'ledger.db'}" in result.stderr
        assert [json.loads(line) for line in result.stdout.splitlines()] == []


def test_the_printed_url_hides_the_password() -> None:
    assert describe_ledger_url("postgresql+psycopg://eo:pw@db/eo") == "postgresql+psycopg://eo:***@db/eo"
