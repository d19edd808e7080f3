"""Where a test run's time went, per test file, from the JUnit XML report ``make test`` keeps.

    .venv/bin/python scripts/test_times.py [.eo/test-report.xml] [--top 25]

Prints each file's summed test time (setup, call and teardown as pytest reports them), its
test count and its slowest test, longest first, then the total: the worker time the two
pytest processes share.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def file_times(report: Path) -> list[tuple[str, float, int, str, float]]:
    """(file, seconds, tests, slowest test, its seconds) per test file, longest first."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    slowest: dict[str, tuple[str, float]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is the dotted module (then a class, if any): tests.unit.core.test_plan
        parts = case.get("classname", "").split(".")
        ends = [i for i, part in enumerate(parts) if part.startswith("test_")]
        path = "/".join(parts[: ends[0] + 1]) + ".py" if ends else ".".join(parts)
        seconds = float(case.get("time") or 0)
        totals[path] += seconds
        counts[path] += 1
        if seconds > slowest.get(path, ("", -1.0))[1]:
            slowest[path] = (case.get("name", ""), seconds)
    rows = [(p, t, counts[p], *slowest[p]) for p, t in totals.items()]
    return sorted(rows, key=lambda row: -row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default=".eo/test-report.xml", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    rows = file_times(args.report)
    for path, seconds, tests, name, worst in rows[: args.top]:
        print(f"{seconds:8.1f} s  {tests:4d} tests  {path}  (slowest: {name} {worst:.1f} s)")
    total = sum(row[1] for row in rows)
    print(f"{total:8.1f} s  {sum(row[2] for row in rows):4d} tests  in {len(rows)} files")


if __name__ == "__main__":
    main()
