"""Ledger URLs: the default, and redaction (no password is ever printed or logged)."""

from __future__ import annotations

import os
import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_LEDGER_URL = "sqlite:///.eo/ledger.db"
ENV_LEDGER_URL = "EO_LEDGER_URL"

_PASSWORD_IN_URL = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@\s]*@")


def default_ledger_url() -> str:
    """``$EO_LEDGER_URL``, else the embedded SQLite file ``.eo/ledger.db``."""
    return os.environ.get(ENV_LEDGER_URL) or DEFAULT_LEDGER_URL


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
