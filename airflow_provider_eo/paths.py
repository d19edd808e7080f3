"""Where the provider keeps its local state (the embedded ledger, jars, broker data, pid files).

One fixed home, never the current directory: a task or a CLI started in another folder
must find the same ledger file, not silently create a second, empty one. A base module
(it imports only :mod:`airflow_provider_eo.errors`): the ledger resolves relative SQLite
URLs against the home and the local stack keeps its jars and broker data there, and
neither may depend on the other.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_eo.errors import ConfigError

ENV_HOME = "EO_HOME"


def checkout_root() -> Path | None:
    """The source checkout this package runs from (the folder holding ``pyproject.toml``
    next to ``airflow_provider_eo/``), or ``None`` for an installed package."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "airflow_provider_eo").is_dir():
            return parent
    return None


def project_root() -> Path:
    """The checkout (see :func:`checkout_root`), else the current directory."""
    return checkout_root() or Path.cwd()


def eo_home() -> Path:
    """The provider's home folder, by the first that applies (not created here):

    1. ``$EO_HOME`` (must be an absolute path, ``~`` allowed);
    2. ``<checkout>/.eo`` when the package runs from a source checkout;
    3. ``~/.eo`` for an installed package.

    Relative SQLite ledger URLs (the default ``sqlite:///ledger.db`` included) resolve
    against it, whatever the working directory.
    """
    env = os.environ.get(ENV_HOME)
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():
            raise ConfigError(
                f"{ENV_HOME}={env!r} is a relative path: it would mean another folder in every "
                "working directory. Set it to an absolute path."
            )
        return path
    root = checkout_root()
    return root / ".eo" if root is not None else Path.home() / ".eo"


def state_dir() -> Path:
    """The provider's home folder (:func:`eo_home`), created if missing."""
    path = eo_home()
    path.mkdir(parents=True, exist_ok=True)
    return path
