"""The torture run in its short, seeded form: every fault kind at least once, then both audits
(by value, and ``eo audit``'s source-based one). The new kinds check themselves on the spot
(abort refused while the committer holds its lease, a restored ledger refused with the sink
untouched, hidden staging refused without publishing): a failed check is a violation.

The long form is ``bench/torture.py --cycles N --seed S`` (same code). Set
``EO_TORTURE_CYCLES`` / ``EO_TORTURE_SEED`` to run this test longer or with another seed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]


def _torture() -> ModuleType:
    """``bench/torture.py`` as a module (bench/ is scripts, not a package)."""
    name = "eo_bench_torture"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "torture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_torture_short_seeded(spark: Any, tmp_path: Path) -> None:
    torture = _torture()
    # One cycle per kind (9) and one spare for a fault the child outran.
    cycles = int(os.environ.get("EO_TORTURE_CYCLES", "10"))
    seed = int(os.environ.get("EO_TORTURE_SEED", "11"))
    # Large checkpoints and a slow feeder keep the catch-up to a few runs.
    result = torture.run(
        cycles, seed, spark=spark, work_dir=tmp_path / "torture", max_records=5000, rate=15.0
    )
    print(result.line())
    detail = "\n".join([*result.log, result.line()])
    # Every fault kind was really injected (a missed fault is retried on a later cycle).
    assert all(result.kinds[k] >= 1 for k in torture.KINDS), detail
    assert result.faults >= len(torture.KINDS) - 1, detail
    assert result.records_in > 0 and result.aborted_in > 0, detail
    assert result.violations == [], detail
    assert result.misrefused == [], detail  # refused, and with the error that names the cause
    assert result.duplicates == 0, detail
    assert result.missing == 0, detail
    assert result.records_out == result.records_in, detail
    assert result.audit_ok, detail
    assert result.group_offsets_ok, detail
    assert result.ok, detail
