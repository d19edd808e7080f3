"""The one error tree: every user-facing error derives from EoError; signals do not."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from airflow_provider_eo import errors
from airflow_provider_eo.errors import ControlSignal, EoError
from airflow_provider_eo.kafka.publisher import Abortable, ProducerLost
from airflow_provider_eo.ledger import errors as ledger_errors
from airflow_provider_eo.pipeline import PipelineConfigError
from airflow_provider_eo.stack.errors import StackError


@pytest.mark.parametrize("module", [errors])
def test_every_error_class_is_in_the_tree_and_documented(module: object) -> None:
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]  # type: ignore[attr-defined]
    assert classes
    for cls in classes:
        assert cls.__doc__ and len(cls.__doc__.strip()) > 20, f"{cls.__name__} needs a docstring"
        if cls is not ControlSignal:
            assert issubclass(cls, EoError), cls


def test_branches_outside_errors_py_share_the_root() -> None:
    for cls in (PipelineConfigError, StackError, ledger_errors.LedgerError):
        assert issubclass(cls, EoError)


def test_control_signals_are_not_user_errors() -> None:
    for cls in (Abortable, ProducerLost):
        assert issubclass(cls, ControlSignal)
        assert not issubclass(cls, EoError)
        assert cls.__bases__ != (Exception,)


def _tree_parents() -> dict[str, str]:
    """Each class named in errors.py's module docstring tree -> the class above it."""
    doc = errors.__doc__ or ""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name), the path to the last line
    for line in doc.splitlines():
        if "── " not in line and line.strip() != "EoError":
            continue
        column = line.index("── ") + 3 if "── " in line else line.index("EoError")
        name = line[column:].split()[0]
        while stack and stack[-1][0] >= column:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((column, name))
    return parents


def test_the_module_docstring_tree_names_every_error_under_its_base() -> None:
    parents = _tree_parents()
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if cls.__module__ != errors.__name__ or cls in (EoError, ControlSignal):
            continue
        assert cls.__name__ in parents, f"{cls.__name__} is missing from the tree in errors.py's docstring"
        assert parents[cls.__name__] == cls.__bases__[0].__name__, cls


def _every_eo_error() -> set[type[EoError]]:
    """Every EoError subclass the package defines (all of its modules imported)."""
    import airflow_provider_eo

    for info in pkgutil.walk_packages(airflow_provider_eo.__path__, "airflow_provider_eo."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: set[type[EoError]] = set()
    todo: list[type[EoError]] = [EoError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("airflow_provider_eo."):
                found.add(sub)
                todo.append(sub)
    return found


def test_every_eo_error_of_the_package_is_defined_in_errors_py() -> None:
    outside = sorted(
        f"{c.__module__}.{c.__name__}" for c in _every_eo_error() if c.__module__ != errors.__name__
    )
    assert not outside, f"define these in airflow_provider_eo/errors.py: {outside}"


def test_a_commit_tasks_error_is_rebuilt_in_the_driver_as_its_class() -> None:
    """A spark-mode commit task returns its error by class name; the driver raises that class
    (or, for a class that needs more than a message, a CommitError naming it)."""
    from airflow_provider_eo.core.commit_on_spark import _raise_shard_failure
    from airflow_provider_eo.core.shard import ShardFailure

    committable = type("C", (), {"where": "pipeline 'p', checkpoint 1, shard 0: "})()
    for cls in _every_eo_error():
        failure = ShardFailure(0, cls.__name__, "what happened", "host-1", 7)
        with pytest.raises(EoError) as raised:
            _raise_shard_failure(committable, failure)  # type: ignore[arg-type]
        if type(raised.value) is not cls:
            assert type(raised.value) is errors.CommitError, (cls, raised.value)
            assert f"{cls.__name__}: what happened" in str(raised.value)
        assert "what happened" in str(raised.value) and "host-1" in str(raised.value)
