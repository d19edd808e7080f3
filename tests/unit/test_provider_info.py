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
    """Every hook/operator/sensor/trigger module is listed, and nothing else (private
    helper modules, ``_name.py``, are not advertised)."""
    info = get_provider_info()
    package = Path(airflow_provider_eo.__file__).parent
    skip = {"base"}  # base.py holds the shared arguments, no operator
    for section in ("hooks", "operators", "sensors", "triggers"):
        listed = {m for entry in info[section] for m in entry["python-modules"]}
        present = {
            f"airflow_provider_eo.{section}.{f.stem}"
            for f in (package / section).glob("*.py")
            if f.stem not in skip and not f.stem.startswith("_")
        }
        assert listed == present, section


def test_config_declares_exactly_the_eo_options_the_code_reads() -> None:
    """Every ``[eo]`` option read (``_setting("...")`` in ui/app.py) is declared, and nothing
    else; ``airflow config list`` shows them with their defaults."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    import airflow_provider_eo.ui.app as app

    read = set(re.findall(r'_setting\("([a-z_]+)"', Path(app.__file__).read_text()))
    declared = set(get_provider_info()["config"]["eo"]["options"])
    assert read == declared == {"ledger_conn_id", "kafka_conn_id", "savepoint_dag_id", "control_dag_id"}
    airflow = str(Path(sys.executable).with_name("airflow"))
    listed = subprocess.run(
        [airflow, "config", "list", "--section", "eo", "--show-values"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for option in declared:
        assert option in listed, listed
    assert "control_dag_id = eo_control" in listed and "savepoint_dag_id = eo_savepoint" in listed


def test_one_version_source() -> None:
    assert get_provider_info()["versions"] == [airflow_provider_eo.__version__]


def test_airflow_reads_the_ledger_connection_form_from_the_provider_info() -> None:
    """Airflow's providers manager (>= 3.2) builds the eo_ledger form from ``conn-fields`` and
    ``ui-field-behaviour`` without importing the hook; the URL field is a password field."""
    import warnings

    from airflow.providers_manager import ProvidersManager

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "get_ui_field_behaviour() is deprecated"
        manager = ProvidersManager()
        behaviours = manager.field_behaviours
        widgets = manager.connection_form_widgets
    assert behaviours["eo_ledger"]["relabeling"]["host"] == "Host (or SQLite file path)"
    url = widgets["extra__eo_ledger__sqlalchemy_url"]
    assert url.is_sensitive and url.field["schema"]["title"] == "SQLAlchemy URL"
    assert widgets["extra__eo_ledger__dialect"].field["schema"]["enum"] == ["postgresql", "sqlite", None]
    assert "kafka" in manager.hooks  # apache-airflow-providers-apache-kafka: the `kafka` connection type
