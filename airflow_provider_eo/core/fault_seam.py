"""The one seam between the protocol code and test fault injection.

Each call is a no-op unless ``EO_FAULT`` is set in the environment; only then is
:mod:`airflow_provider_eo.testing.faults` imported (lazily), so a production process never
loads the test code. The protocol's crash points are named in ``testing.faults.STEPS``.

The only import of :mod:`airflow_provider_eo.testing` by production code: the import contract
"production-not-testing-or-demo" (pyproject.toml) allows exactly this edge, and
tests/unit/core/test_fault_seam.py proves it stays unloaded without ``EO_FAULT``.
"""

from __future__ import annotations

import os


def fault_point(step: str) -> None:
    """Crash, pause or exit at ``step`` when a test asked for it (``EO_FAULT=<step>``)."""
    if "EO_FAULT" not in os.environ:
        return
    from airflow_provider_eo.testing import faults

    faults.fault_point(step)


def fault_triggered(step: str) -> bool:
    """True once when a test asked the caller to simulate ``step``'s failure itself."""
    if "EO_FAULT" not in os.environ:
        return False
    from airflow_provider_eo.testing import faults

    return faults.fault_triggered(step)
