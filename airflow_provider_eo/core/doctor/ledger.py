"""The ledger: reachable and migrated."""

from __future__ import annotations

from airflow_provider_eo.core.doctor.report import Finding


def judge_ledger(current: str | None, head: str, *, dialect: str, url: str) -> Finding:
    """The ledger's schema revision against the package's head."""
    check = "ledger"
    if current == head:
        return Finding(check, "ok", f"{url} reachable, schema at head ({head})")
    if current is None:
        return Finding(
            check,
            "warn",
            f"{url} reachable but has no ledger schema yet",
            "none needed: the first plan creates it (or run `eo ledger upgrade --ledger-url ...`)",
        )
    if dialect == "sqlite":
        return Finding(
            check,
            "warn",
            f"{url} has schema revision {current}, this package needs {head}",
            "none needed: SQLite ledgers are upgraded when opened (or run `eo ledger upgrade`)",
        )
    return Finding(
        check,
        "fail",
        f"{url} has schema revision {current}, this package needs {head}: it refuses to run on it",
        "run `eo ledger upgrade --ledger-url ...` once",
    )
