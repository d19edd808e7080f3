"""`eo` output never shows a ledger password: the URL is printed redacted, errors too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.postgres]

EO = str(Path(sys.executable).parent / "eo")
CANARY = "pw-canary-41f7"


def _eo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EO, *args], capture_output=True, text=True, timeout=120, check=False)


def test_eo_output_redacts_the_ledger_password(pg_url: str) -> None:
    # Trust auth on the test server: the password is accepted and ignored (a canary).
    url = make_url(pg_url).set(password=CANARY).render_as_string(hide_password=False)
    missing = (
        make_url(pg_url).set(password=CANARY, database="no_such_db_eo").render_as_string(hide_password=False)
    )
    runs = [
        _eo("ledger", "upgrade", "--ledger-url", url),
        _eo("pipelines", "--ledger-url", url),
        _eo("checkpoints", "no-such-pipeline", "--ledger-url", url),
        _eo("pipelines", "--ledger-url", missing),  # a connection error names the URL
    ]
    assert runs[0].returncode == 0 and runs[1].returncode == 0, runs
    assert runs[2].returncode != 0 and runs[3].returncode != 0, runs
    for proc in runs:
        text = proc.stdout + proc.stderr
        assert CANARY not in text, text
        assert "***" in text, text
