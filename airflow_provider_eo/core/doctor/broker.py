"""The broker's settings: its transaction time-out limit against the pipeline's."""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_eo.core.doctor.report import BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS, Finding


def judge_transaction_timeout(
    pipeline_ms: int, broker_max_ms: Mapping[int, int | None], *, pipeline: str
) -> Finding:
    """The pipeline's ``transaction_timeout_ms`` against every broker's
    ``transaction.max.timeout.ms`` (``None``: the broker would not say, e.g. ACLs).

    Above any broker's maximum, ``init_transactions`` fails with INVALID_TRANSACTION_TIMEOUT
    on the coordinator of that broker: fail. Unknown for some broker: warn.
    """
    check = "transaction-timeout"
    known = {b: v for b, v in broker_max_ms.items() if v is not None}
    too_low = {b: v for b, v in known.items() if pipeline_ms > v}
    if too_low:
        lowest = min(too_low.values())
        brokers = ", ".join(f"broker {b}: {v}" for b, v in sorted(too_low.items()))
        return Finding(
            check,
            "fail",
            f"pipeline {pipeline!r}: transaction_timeout_ms={pipeline_ms} is above the broker's "
            f"transaction.max.timeout.ms ({brokers}); every commit would fail in "
            "init_transactions (INVALID_TRANSACTION_TIMEOUT)",
            f"set Pipeline(transaction_timeout_ms=...) to at most {lowest}, or raise "
            f"transaction.max.timeout.ms on the brokers to at least {pipeline_ms}",
        )
    unknown = sorted(b for b, v in broker_max_ms.items() if v is None)
    if unknown or not broker_max_ms:
        return Finding(
            check,
            "warn",
            f"transaction.max.timeout.ms could not be read from broker(s) {unknown or '(none answered)'} "
            f"(DescribeConfigs refused?); the pipeline uses transaction_timeout_ms={pipeline_ms}",
            "grant DescribeConfigs on the cluster to check it, or make sure transaction_timeout_ms "
            "stays at most the brokers' transaction.max.timeout.ms "
            f"(default {BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS})",
        )
    return Finding(
        check,
        "ok",
        f"transaction_timeout_ms={pipeline_ms} <= transaction.max.timeout.ms={min(known.values())} "
        f"on {len(known)} broker(s)",
    )
