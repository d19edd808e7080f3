"""Test-only helpers shipped with the package (fault injection). Production code never
imports this package at module level: see :mod:`airflow_provider_eo.core.fault_seam`."""
