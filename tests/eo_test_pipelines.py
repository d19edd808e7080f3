"""`eo` CLI entry points for tests: the Pipeline comes from $EO_TEST_PIPELINE_JSON."""

from __future__ import annotations

import os

from airflow_provider_eo.pipeline import Pipeline


def from_env() -> Pipeline:
    """The pipeline a test serialized into the child process's environment."""
    return Pipeline.from_json(os.environ["EO_TEST_PIPELINE_JSON"])
