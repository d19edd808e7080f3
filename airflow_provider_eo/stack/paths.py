"""Where the local stack keeps its state (jars, broker data, pid files)."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The folder holding the checkout's ``pyproject.toml``, else the current directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "airflow_provider_eo").is_dir():
            return parent
    return Path.cwd()


def state_dir() -> Path:
    """The project-local state folder: ``$EO_HOME`` if set, else ``<project>/.eo``."""
    env = os.environ.get("EO_HOME")
    path = Path(env) if env else project_root() / ".eo"
    path.mkdir(parents=True, exist_ok=True)
    return path
