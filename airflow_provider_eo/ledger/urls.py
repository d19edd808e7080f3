"""Ledger URLs: the default, where a relative SQLite file lives, and redaction (no
password is ever printed or logged).

A relative SQLite path (``sqlite:///ledger.db``, ``sqlite:///eo-ledger.db``) resolves
against the provider's home folder (``$EO_HOME``, else ``<checkout>/.eo`` when running
from a source checkout, else ``~/.eo``: see :func:`airflow_provider_eo.paths.eo_home`),
never against the working directory: a task or CLI started elsewhere must open the same
ledger file, not a second, empty one (a new ledger would re-publish or, worse, skip by
foreign markers).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from airflow_provider_eo.paths import eo_home

DEFAULT_LEDGER_URL = "sqlite:///ledger.db"
"""The embedded default: ``<eo home>/ledger.db`` (see :func:`resolve_ledger_url`)."""
ENV_LEDGER_URL = "EO_LEDGER_URL"

_PASSWORD_IN_URL = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@\s]*@")


def default_ledger_url() -> str:
    """``$EO_LEDGER_URL``, else the embedded SQLite file ``<eo home>/ledger.db``."""
    return os.environ.get(ENV_LEDGER_URL) or DEFAULT_LEDGER_URL


def resolve_ledger_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute against the eo home
    (``~`` expanded); every other URL (PostgreSQL, in-memory or ``file:`` URI SQLite,
    absolute paths) is returned unchanged. The ledger opens only resolved URLs."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return url
    path = Path(database).expanduser()
    if path.is_absolute():
        if str(path) == database:
            return url
    else:
        path = eo_home() / path
    return parsed.set(database=str(path)).render_as_string(hide_password=False)


def describe_ledger_url(url: str) -> str:
    """The resolved, redacted URL: what ``eo`` prints as ``ledger: ...``."""
    return redact_url(resolve_ledger_url(url))


def redact_url(url: str | object) -> str:
    """The URL with its password replaced by ``***``; safe to print and log."""
    text = str(url) if not isinstance(url, str) else url
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        return _PASSWORD_IN_URL.sub(r"\g<head>***@", text)
    return parsed.render_as_string(hide_password=True)


def redact_text(text: str, url: str | object) -> str:
    """``text`` with the URL's password (if any) masked, e.g. a driver error message."""
    try:
        password = make_url(str(url)).password
    except (ArgumentError, ValueError):
        password = None
    if password:
        text = text.replace(str(password), "***")
    return _PASSWORD_IN_URL.sub(r"\g<head>***@", text)
