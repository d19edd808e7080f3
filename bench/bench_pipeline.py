"""`eo commit` entry point for bench/e2e.py: the Pipeline comes from $EO_BENCH_PIPELINE_JSON."""

from __future__ import annotations

import os

from airflow_provider_eo.pipeline import Pipeline


def from_env() -> Pipeline:
    """The benchmark's pipeline."""
    return Pipeline.from_json(os.environ["EO_BENCH_PIPELINE_JSON"])
