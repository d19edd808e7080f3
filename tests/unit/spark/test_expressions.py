"""The per-JVM expression cache: built once per gateway and key, bounded, nothing kept
without a JVM."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark import SparkContext

from airflow_provider_eo.spark import expressions


def test_built_once_per_gateway_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []

    def build(key: str) -> Any:
        builds.append(key)
        return [key]

    cache: dict[Any, Any] = {}
    first, second = object(), object()
    monkeypatch.setattr(SparkContext, "_gateway", first)
    assert expressions.per_jvm(cache, "a", lambda: build("a")) == ["a"]
    assert expressions.per_jvm(cache, "a", lambda: build("a")) == ["a"]
    expressions.per_jvm(cache, "b", lambda: build("b"))
    assert builds == ["a", "b"]
    monkeypatch.setattr(SparkContext, "_gateway", second)  # another JVM: its own expressions
    expressions.per_jvm(cache, "a", lambda: build("a"))
    assert builds == ["a", "b", "a"]
    monkeypatch.setattr(SparkContext, "_gateway", None)  # no JVM: built, not kept
    cache.clear()
    expressions.per_jvm(cache, "a", lambda: build("a"))
    assert cache == {}


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SparkContext, "_gateway", object())
    cache: dict[Any, Any] = {}
    for i in range(expressions.KEPT * 3):
        expressions.per_jvm(cache, i, str)
    assert len(cache) <= expressions.KEPT
