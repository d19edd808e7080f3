"""The fault-injection seam: production processes never load the test module."""

from __future__ import annotations

import os
import subprocess
import sys


def test_production_modules_do_not_load_fault_injection() -> None:
    """The protocol modules import only the seam; the test module loads when EO_FAULT is set."""
    code = (
        "import sys, airflow_provider_eo.core.commit, airflow_provider_eo.spark.prepare, "
        "airflow_provider_eo.cli; print('airflow_provider_eo.testing.faults' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "EO_FAULT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
