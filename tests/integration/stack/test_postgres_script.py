"""scripts/postgres.sh from a clone the ``postgres`` user cannot reach.

A clone inside root's home folder or a ``mktemp -d`` folder (mode 700) used to fail with
``initdb: could not access directory ... Permission denied``: the database's files must be
kept where the server can reach them, and ``stop`` must stop what ``start`` started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "postgres.sh"

pytestmark = pytest.mark.postgres


def _parse(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@pytest.fixture()
def private_clone() -> Iterator[Path]:
    """A copy of the script in ``<mkdtemp (mode 700)>/home/clone/scripts``."""
    parent = Path(tempfile.mkdtemp(prefix="eo-clone-"))
    assert parent.stat().st_mode & 0o777 == 0o700
    clone = parent / "home" / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, clone / "scripts" / "postgres.sh")
    try:
        yield clone
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _run(clone: Path, command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EO_PG_DIR"}  # the default location
    return subprocess.run(
        ["bash", str(clone / "scripts" / "postgres.sh"), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_start_and_stop_from_a_folder_postgres_cannot_read(private_clone: Path) -> None:
    started = _run(private_clone, "start")
    info = _parse(started.stdout)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert info["EO_PG_STARTED"] == "1", started.stdout
        engine = create_engine(info["EO_PG_URL"])
        try:
            with engine.connect() as conn:
                assert conn.execute(text("select 1")).scalar() == 1
        finally:
            engine.dispose()
        again = _run(private_clone, "start")  # idempotent: finds the running cluster
        assert again.returncode == 0, again.stderr[-3000:]
        assert _parse(again.stdout)["EO_PG_STARTED"] == "0"
        assert _parse(again.stdout)["EO_PG_URL"] == info["EO_PG_URL"]
    finally:
        stopped = _run(private_clone, "stop")
        state = info.get("EO_PG_DIR")
        status = _run(private_clone, "status")
        if state and not state.startswith(str(private_clone)):
            shutil.rmtree(state, ignore_errors=True)  # the fallback folder outside the clone
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert status.returncode == 1, f"still running after stop: {status.stdout}"
