"""The one place where an ``eo`` command turns an error into a message and an exit code.

Exit codes: 0 done; 1 an error (the message says what happened and what to do next);
2 a failed audit (``eo audit``); 3 a stopped pipeline (``eo plan`` / ``eo run-once``: not a
failure, nothing new is planned until ``eo resume``); 4 an audit that found nothing wrong
but checked some source records by count only (``eo audit``: output without source
positions). Usage errors are typer's own (2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console

from airflow_provider_eo.errors import EoError, PipelineStopped

#: Every diagnostic goes to stderr, so ``--json`` output on stdout stays parseable.
err = Console(stderr=True)

EXIT_ERROR = 1
#: ``eo audit`` found a committed checkpoint whose records the sink does not hold exactly once.
EXIT_AUDIT_FAILED = 2
#: ``eo plan`` / ``eo run-once`` on a stopped pipeline with nothing unfinished (``eo resume``).
EXIT_STOPPED = 3
#: ``eo audit`` found nothing duplicated or missing, but some committed output carries no
#: source position (an aggregation), so its source records were checked by count only.
EXIT_AUDIT_COUNT_ONLY = 4


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def reported(errors: type[EoError] = EoError, *, stopped: int = EXIT_ERROR) -> Iterator[None]:
    """Run the block; an ``errors`` instance raised in it is printed with :func:`fail` and
    exits 1, a :class:`PipelineStopped` exits with ``stopped``. Anything else (a bug, a
    ``typer.Exit``) passes through unchanged.

    Every error a user can hit derives from :class:`EoError` (``errors.py``); the ledger's
    own commands narrow it to ``LedgerError``. A refused streaming setting names it as the
    flag the user typed (``--interval``).
    """
    try:
        yield
    except PipelineStopped as exc:
        if not isinstance(exc, errors):
            raise
        fail(str(exc), stopped)
    except errors as exc:
        from airflow_provider_eo.core.stream_contract import StreamArgsError

        fail(exc.cli_message if isinstance(exc, StreamArgsError) else str(exc))
