"""A ``postgres`` connection's libpq extras reach the real server: ``sslmode=require``
against the test server (no SSL) is refused by libpq, and ``application_name`` is what the
server records for the ledger's sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.postgres]

EO = str(Path(sys.executable).parent / "eo")


def _conn(pg_url: str, **extra: str) -> str:
    url = make_url(pg_url)
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": url.host,
            "port": url.port,
            "schema": url.database,
            "login": url.username,
            "extra": extra,
        }
    )


def _upgrade(pg_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW_CONN_EO_PG_EXTRAS": _conn(pg_url, **extra)}
    return subprocess.run(
        [EO, "ledger", "upgrade", "--conn-id", "eo_pg_extras"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_sslmode_reaches_libpq(pg_fresh_url: str) -> None:
    refused = _upgrade(pg_fresh_url, sslmode="require")
    assert refused.returncode != 0
    assert "SSL" in refused.stdout + refused.stderr, refused
    done = _upgrade(pg_fresh_url, sslmode="disable")
    assert done.returncode == 0, done


def test_application_name_names_the_ledgers_sessions(pg_fresh_url: str) -> None:
    from airflow_provider_eo.hooks.ledger import LedgerHook
    from airflow_provider_eo.ledger import Ledger

    os.environ["AIRFLOW_CONN_EO_PG_APPNAME"] = _conn(pg_fresh_url, application_name="eo-ledger-probe")
    try:
        url = LedgerHook("eo_pg_appname").get_url()
    finally:
        del os.environ["AIRFLOW_CONN_EO_PG_APPNAME"]
    with Ledger(url) as ledger:
        ledger.list_pipelines()
        engine = create_engine(pg_fresh_url)
        try:
            with engine.connect() as conn:
                names = conn.execute(text("SELECT application_name FROM pg_stat_activity")).scalars().all()
        finally:
            engine.dispose()
    assert "eo-ledger-probe" in names, names
