"""Where a test run's time went, per test file, from the JUnit XML report ``make test`` keeps.

    .venv/bin/python scripts/test_times.py [.eo/test-report.xml] [--top 25]
    .venv/bin/python scripts/test_times.py --timeline [.eo/test-timeline.jsonl] [--top 25]

Prints each file's summed test time (setup, call and teardown as pytest reports them), its
test count and its slowest test, longest first, then the total: the worker time the two
pytest processes share.

``--timeline`` reads the timeline ``make test`` also keeps and prints, per file, its wall
time, the CPU its worker and the children it reaped used, and the machine's idle
core-seconds while it ran, most idle first: on two cores the run is CPU-bound, so a file
that leaves cores idle waits on something (a time-out, a poll, a broker's delay) that could
be cut. Idle seconds are the machine's: a file running beside another shares them.
"""

from __future__ import annotations

import argparse
import json
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


def timeline(path: Path) -> list[tuple[str, float, float, float, int]]:
    """(file, wall s, own CPU s, machine idle core-s, tests) per test file, most idle first."""
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for line in path.read_text().splitlines():
        test = json.loads(line)
        row = rows[test["test"].split("::", 1)[0]]
        row[0] += test["end"] - test["start"]
        row[1] += test["own_cpu"]
        row[2] += test["machine_idle"]
        row[3] += 1
    out = [(f, wall, own, idle, int(n)) for f, (wall, own, idle, n) in rows.items()]
    return sorted(out, key=lambda row: -row[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, help="default: .eo/test-report.xml")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--timeline", action="store_true", help="read .eo/test-timeline.jsonl")
    args = parser.parse_args()
    if args.timeline:
        found = timeline(args.report or Path(".eo/test-timeline.jsonl"))
        for path, wall, own, idle, tests in found[: args.top]:
            print(f"{idle:7.1f} idle core-s  {wall:7.1f} s wall  {own:7.1f} s CPU  {tests:4d} tests  {path}")
        walls, idles = sum(r[1] for r in found), sum(r[3] for r in found)
        print(f"{idles:7.1f} idle core-s  {walls:7.1f} s wall  in {len(found)} files")
        return
    args.report = args.report or Path(".eo/test-report.xml")
    rows = file_times(args.report)
    for path, seconds, tests, name, worst in rows[: args.top]:
        print(f"{seconds:8.1f} s  {tests:4d} tests  {path}  (slowest: {name} {worst:.1f} s)")
    total = sum(row[1] for row in rows)
    print(f"{total:8.1f} s  {sum(row[2] for row in rows):4d} tests  in {len(rows)} files")


if __name__ == "__main__":
    main()
