"""Process checks shared by the local stack (the broker's pid) and streaming mode (a stream
run's pid on this host). Never imports Airflow or Spark."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` of this host exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    if stat.is_file():
        try:
            return stat.read_text().rsplit(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return True
    return True
