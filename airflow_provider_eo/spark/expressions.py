"""Column expressions built once per JVM instead of once per checkpoint.

Building a column costs py4j round trips (the staged columns of one checkpoint took ~500,
tens of milliseconds); the expressions are plain, unresolved ones, valid in every session of
the JVM that built them. A foreachBatch frame comes with a new Python session object every
batch, so the cache is keyed by the py4j gateway (one per JVM), never by a session object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["per_jvm"]

T = TypeVar("T")

#: Entries kept per cache: a key may vary per checkpoint (e.g. a stream's live partitions).
KEPT = 32


def per_jvm(cache: dict[Hashable, tuple[Any, Any]], key: Hashable, build: Callable[[], T]) -> T:
    """``build()``'s value for ``key``, built once per JVM (the py4j gateway ``cache`` saw it
    with); without a running JVM's gateway nothing is kept. ``cache`` holds at most
    :data:`KEPT` entries (emptied when full)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    hit = cache.get(key)
    if hit is not None and gateway is not None and hit[0] is gateway:
        return hit[1]  # type: ignore[no-any-return,unused-ignore]
    value = build()
    if gateway is not None:
        if len(cache) >= KEPT:
            cache.clear()
        cache[key] = (gateway, value)
    return value
