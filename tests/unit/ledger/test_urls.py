from __future__ import annotations

import pytest

from airflow_provider_eo.ledger import default_ledger_url, redact_url
from airflow_provider_eo.ledger.urls import redact_text


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
    assert default_ledger_url() == "sqlite:///.eo/ledger.db"
    monkeypatch.setenv("EO_LEDGER_URL", "sqlite:////tmp/x.db")
    assert default_ledger_url() == "sqlite:////tmp/x.db"
