"""bench/compare.py's pure parts: reading the benches' machine-readable lines, the medians
and the before/after table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compare.py"


def _compare() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eo_bench_compare", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


STREAM_OUTPUT = """\
WARNING: Using incubator modules: jdk.incubator.vector
[stream 10:00:01] phase 1/3 ...
stream_case: interval_s=5 max_records=0 eo_p50_s=3.41 spark_p50_s=2.67 eo_rps=195584 spark_rps=228185
stream_case: interval_s=1 max_records=0 eo_p50_s=1.35 spark_p50_s=0.62 eo_rps=194851 spark_rps=228125
stream: interval_s=5 rate=1000 eo_p50_s=3.41 spark_p50_s=2.67 note=text
"""


def test_lines_of_the_same_name_are_told_apart_by_their_place() -> None:
    lines = _compare().parse_lines(STREAM_OUTPUT)
    assert set(lines) == {"stream_case", "stream_case#2", "stream"}
    assert lines["stream_case"]["interval_s"] == "5"
    assert lines["stream_case#2"]["interval_s"] == "1"
    assert lines["stream"]["note"] == "text"


def test_medians_per_line_and_numeric_field() -> None:
    compare = _compare()
    runs = [
        compare.parse_lines(f"ss_sink: eo_rps={rps} eo_p50_s={p50} mode=update")
        for rps, p50 in ((70000, 1.5), (80000, 1.2), (60000, 1.9))
    ]
    med = compare.medians(runs)
    assert med == {"ss_sink": {"eo_rps": 70000, "eo_p50_s": 1.5}}  # the text field is left out


def test_the_report_gives_each_fields_medians_and_ratio() -> None:
    compare = _compare()
    before = compare.Side(ref="old", commit="a" * 40)
    after = compare.Side(ref="new", commit="b" * 40)
    before.runs["ss_sink"] = [compare.parse_lines("ss_sink: eo_rps=50000 eo_p50_s=2.0")] * 3
    after.runs["ss_sink"] = [compare.parse_lines("ss_sink: eo_rps=75000 eo_p50_s=1.0")] * 2
    after.failed["ss_sink"] = 1
    text = "\n".join(compare.report(before, after, ["ss_sink"]))
    assert "before 3, failed 0; after 2, failed 1" in text
    assert "| eo_rps | 50000 | 75000 | 1.50 |" in text
    assert "| eo_p50_s | 2 | 1 | 0.50 |" in text
