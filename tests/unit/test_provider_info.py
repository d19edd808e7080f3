"""Every module and class named by get_provider_info() exists."""

from __future__ import annotations

import importlib
from pathlib import Path

import airflow_provider_eo
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


def test_advertises_exactly_the_modules_that_exist() -> None:
    """Every hook/operator/sensor/trigger module is listed, and nothing else."""
    info = get_provider_info()
    package = Path(airflow_provider_eo.__file__).parent
    skip = {"__init__", "base"}  # base.py holds the shared arguments, no operator
    for section in ("hooks", "operators", "sensors", "triggers"):
        listed = {m for entry in info[section] for m in entry["python-modules"]}
        present = {
            f"airflow_provider_eo.{section}.{f.stem}"
            for f in (package / section).glob("*.py")
            if f.stem not in skip
        }
        assert listed == present, section


def test_no_config_section_nobody_reads() -> None:
    """No ``[eo]`` option is read anywhere, so none is advertised."""
    assert "config" not in get_provider_info()


def test_one_version_source() -> None:
    assert get_provider_info()["versions"] == [airflow_provider_eo.__version__]
