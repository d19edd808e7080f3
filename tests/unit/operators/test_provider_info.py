"""Every module and class named by get_provider_info() exists."""

from __future__ import annotations

import importlib

from airflow_provider_eo.provider_info import get_provider_info


def test_modules_and_classes_import() -> None:
    info = get_provider_info()
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for conn in info["connection-types"]:
        module, _, name = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == conn["connection-type"]
