from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_eo.hooks.ledger import LedgerHook


def _conn_env(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_no_work_in_init(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("looked up a connection in __init__")

    monkeypatch.setattr(LedgerHook, "get_connection", boom)
    hook = LedgerHook()
    assert hook.eo_ledger_conn_id == "eo_ledger_default" and hook._ledger is None


def test_raw_url_and_lazy_ledger(tmp_path: Path) -> None:
    hook = LedgerHook(sqlalchemy_url=f"sqlite:///{tmp_path / 'l.db'}")
    ledger = hook.get_ledger()
    assert hook.get_ledger() is ledger
    assert ledger.current_revision() == ledger.head_revision()
    assert hook.test_connection()[0] is True


def test_sqlite_path_in_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _conn_env(monkeypatch, "eo_ledger_default", conn_type="eo_ledger", host=str(tmp_path / "ledger.db"))
    assert LedgerHook().get_url() == f"sqlite:///{tmp_path / 'ledger.db'}"


def test_postgres_from_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn_env(
        monkeypatch,
        "pg_ledger",
        conn_type="eo_ledger",
        host="db.example",
        port=5432,
        schema="eo",
        login="eo",
        password="p@ss",
    )
    url = LedgerHook("pg_ledger").get_url()
    assert url == "postgresql+psycopg://eo:p%40ss@db.example:5432/eo"


def test_extra_sqlalchemy_url_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn_env(
        monkeypatch,
        "x",
        conn_type="eo_ledger",
        host="ignored",
        extra={"sqlalchemy_url": "sqlite:////tmp/elsewhere.db"},
    )
    assert LedgerHook("x").get_url() == "sqlite:////tmp/elsewhere.db"


def test_unreachable_reports_without_password() -> None:
    ok, message = LedgerHook(
        sqlalchemy_url="postgresql+psycopg://eo:hunter2@127.0.0.1:1/eo"
    ).test_connection()
    assert not ok and "hunter2" not in message and "unavailable" in message


def test_a_postgres_connections_libpq_extras_reach_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Postgres provider's form keeps sslmode & co. in the extra: they go into the URL's
    query (psycopg hands them to libpq); the provider's own keys are not libpq's and stay out."""
    _conn_env(
        monkeypatch,
        "pg_ssl",
        conn_type="postgres",
        host="db.example",
        schema="eo",
        login="eo",
        extra={
            "sslmode": "verify-full",
            "sslrootcert": "/etc/ssl/ca.pem",
            "application_name": "eo-ledger",
            "cursor": "dictcursor",
        },
    )
    from sqlalchemy.engine import make_url

    url = make_url(LedgerHook("pg_ssl").get_url())
    assert url.drivername == "postgresql+psycopg" and url.host == "db.example"
    assert dict(url.query) == {
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ssl/ca.pem",
        "application_name": "eo-ledger",
    }


def test_iam_authentication_is_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.errors import ConfigError

    _conn_env(monkeypatch, "pg_iam", conn_type="postgres", host="db.example", extra={"iam": True})
    with pytest.raises(ConfigError, match=r"'pg_iam': IAM authentication.*sqlalchemy_url"):
        LedgerHook("pg_iam").get_url()
