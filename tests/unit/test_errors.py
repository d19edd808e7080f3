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
