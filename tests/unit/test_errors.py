"""The one error tree: every user-facing error derives from EoError; signals do not."""

from __future__ import annotations

import inspect

import pytest

from airflow_provider_eo import errors
from airflow_provider_eo.errors import ControlSignal, EoError
from airflow_provider_eo.kafka.publisher import Abortable, ProducerLost
from airflow_provider_eo.ledger import errors as ledger_errors
from airflow_provider_eo.pipeline import PipelineConfigError
from airflow_provider_eo.stack.errors import StackError


@pytest.mark.parametrize("module", [errors, ledger_errors])
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
