"""Opt-in (EO_SLOW=1): kill `eo run-once` at random moments, retry, audit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("EO_SLOW"), reason="long chaos run: set EO_SLOW=1"),
]


def test_random_kills_never_duplicate_or_lose(harness: Callable[..., Any]) -> None:
    rng = random.Random(int(os.environ.get("EO_CHAOS_SEED", "7")))
    h = harness(source_partitions=3, sink_partitions=3, max_records_per_checkpoint=150, commit_shards=2)
    produced = 0
    for _round in range(int(os.environ.get("EO_CHAOS_ROUNDS", "8"))):
        h.produce(100, start=produced)
        produced += 100
        proc = h.cli("run-once", wait=False)
        try:  # a random deadline is the point of this test: kill wherever it has got to
            proc.proc.wait(timeout=rng.uniform(2.0, 14.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
    h.drain()
    h.assert_exactly_once(expected_records=produced)
