"""Consumer lag for the UI: log end offsets read through a bounded, cached Kafka call.

A page request never waits on Kafka. It gets what the cache holds (with its age), and a
stale or missing entry starts one background refresh (at most one in flight per pipeline,
each bounded by ``timeout_s``). The first request for a pipeline answers ``pending``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

Partitions = list[tuple[str, int]]
#: Reads the log end offsets of partitions (raises on failure; bounded by the caller).
EndsReader = Callable[[Partitions, float], Mapping[tuple[str, int], int]]


@dataclass
class _Entry:
    ends: Mapping[tuple[str, int], int] | None = None
    fetched_at: float | None = None
    error: str | None = None
    refreshing: bool = False


class LagCache:
    """Cached log end offsets per pipeline.

    :param read_ends: reads log end offsets (``(partitions, timeout_s) -> {tp: end}``).
    :param ttl_s: an entry older than this is refreshed in the background.
    :param timeout_s: bound of one Kafka call.
    """

    def __init__(self, read_ends: EndsReader, *, ttl_s: float = 10.0, timeout_s: float = 5.0) -> None:
        self._read_ends = read_ends
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eo-lag")

    def lag(self, pipeline: str, committed: Mapping[tuple[str, int], int]) -> dict[str, Any]:
        """Lag of ``pipeline`` per partition (log end - committed end) and in total, from
        the cached log ends; never blocks on Kafka.

        ``state``: ``ok``, ``pending`` (first read under way), ``error`` (the last read
        failed; ``error`` says why, older ends are still shown when there are some).
        """
        partitions = sorted(committed)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.setdefault(pipeline, _Entry())
            stale = entry.fetched_at is None or now - entry.fetched_at > self.ttl_s
            if stale and not entry.refreshing and partitions:
                entry.refreshing = True
                self._pool.submit(self._refresh, pipeline, partitions)
            ends, fetched_at, error = entry.ends, entry.fetched_at, entry.error
        rows = []
        total = 0
        for topic, partition in partitions:
            end = None if ends is None else ends.get((topic, partition))
            lag = None if end is None else max(0, end - committed[(topic, partition)])
            total += lag or 0
            rows.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committed_end": committed[(topic, partition)],
                    "log_end": end,
                    "lag": lag,
                }
            )
        if not partitions:
            state = "ok"
        elif error is not None:
            state = "error"
        elif ends is None:
            state = "pending"
        else:
            state = "ok"
        age = None if fetched_at is None else round(now - fetched_at, 1)
        as_of = (
            None
            if fetched_at is None
            else datetime.fromtimestamp(time.time() - (now - fetched_at), tz=timezone.utc).isoformat()
        )
        return {
            "state": state,
            "partitions": rows,
            "total": total if ends is not None or not partitions else None,
            "as_of": as_of,
            "age_s": age,
            "error": error,
        }

    def _refresh(self, pipeline: str, partitions: Partitions) -> None:
        try:
            ends = dict(self._read_ends(partitions, self.timeout_s))
            error = None
        except Exception as exc:  # shown on the page; the next request tries again
            ends, error = None, f"{type(exc).__name__}: {exc}"
        with self._lock:
            entry = self._entries.setdefault(pipeline, _Entry())
            entry.refreshing = False
            entry.fetched_at = time.monotonic()
            entry.error = error
            if ends is not None:
                entry.ends = ends

    def close(self) -> None:
        """Stop the refresh threads (pending refreshes are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
