"""The local stack's folders: the provider's home (:mod:`airflow_provider_eo.paths`), where
the stack keeps its jars, broker data and pid files. Re-exported under the stack's name so
the stack's modules, the demo and the example DAGs read ``stack.paths.state_dir``."""

from __future__ import annotations

from airflow_provider_eo.paths import ENV_HOME, checkout_root, eo_home, project_root, state_dir

__all__ = ["ENV_HOME", "checkout_root", "eo_home", "project_root", "state_dir"]
