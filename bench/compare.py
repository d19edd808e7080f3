"""Before/after medians of the benchmarks: two commits, the same benches, alternated rounds.

Usage:
  .venv/bin/python bench/compare.py --before REF --after REF [--rounds 3] [--bench NAME ...]

Each commit gets a git worktree of its own under ``.eo/compare/<commit>`` with its own
``.venv`` (``scripts/bootstrap.sh``, first use only), so each side runs its own code and its
own copy of the benches. Every round runs each bench once per side, the side that goes first
alternating from round to round (the machine's speed drifts over an hour; alternating
spreads the drift over both sides). Each run's output is kept under
``.eo/compare/logs/``; a run that exits non-zero is reported and left out of the medians.

Every bench's machine-readable lines (``name: key=value ...``) are collected; a line is
told apart by its name and its place among that run's lines of the same name (the three
``stream_case`` lines of ``bench/stream.py --cases``). The report is a table per line: for
each numeric field, the median of the rounds on each side and after ÷ before. The last
line is machine-readable.

The default benches are the small-checkpoint set: the Structured Streaming sink, the stream
at a 5 s and a 1 s interval and with 125k-record checkpoints, end to end at 1M and 4M
records, and the provenance header's produce cost. Run it on an otherwise idle machine:
the default set takes about 25 minutes a round (both sides). ``--bench stream_latency`` (not
in the default set) runs only the stream's 1 s and 5 s latency cases, about 10 minutes a
round.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> the bench and its arguments (run with the side's own ``.venv/bin/python``).
BENCHES: dict[str, list[str]] = {
    name: shlex.split(command)
    for name, command in {
        "ss_sink": "bench/ss_sink.py --backlog 400000 --batch 100000 --rounds 1 --interval 5 "
        "--rate 1000 --seconds 40",
        "stream": "bench/stream.py --cases 5:0,1:0,5:125000 --rate 1000 --seconds 60 --backlog 500000",
        # The stream's latency at 1 s and 5 s alone (one throughput round per case); not a default.
        "stream_latency": "bench/stream.py --cases 1:0,5:0 --rate 1000 --seconds 40 --rounds 1 "
        "--warm-passes 1",
        "e2e_1m": "bench/e2e.py --records 1000000",
        "e2e_4m": "bench/e2e.py --records 4000000",
        "provenance": "bench/provenance.py --records 300000 --rounds 9",
    }.items()
}
#: The benches run when none is named.
DEFAULT_BENCHES = [name for name in BENCHES if name != "stream_latency"]

#: A machine-readable line: ``name: key=value key=value ...``.
LINE = re.compile(r"^([a-z][a-z0-9_]*): ((?:[A-Za-z0-9_.]+=\S+ ?)+)$")


def parse_lines(output: str) -> dict[str, dict[str, str]]:
    """The machine-readable lines of one run, keyed ``name`` (first of its name) or
    ``name#2``, ``name#3`` ... (later ones), each as its ``key -> value`` fields."""
    found: dict[str, dict[str, str]] = {}
    seen: dict[str, int] = {}
    for raw in output.splitlines():
        match = LINE.match(raw.strip())
        if match is None:
            continue
        name = match.group(1)
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name}#{seen[name]}"
        found[key] = dict(pair.split("=", 1) for pair in match.group(2).split())
    return found


def _number(value: str) -> float | None:
    try:
        return float(value.removesuffix("x"))
    except ValueError:
        return None


@dataclass
class Side:
    """One commit's runs: per bench, the parsed lines of each successful run."""

    ref: str
    commit: str
    runs: dict[str, list[dict[str, dict[str, str]]]] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)


def medians(runs: Sequence[dict[str, dict[str, str]]]) -> dict[str, dict[str, float]]:
    """Per line and numeric field, the median over ``runs`` (fields missing from a run are
    taken over the runs that have them)."""
    values: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for line, fields in run.items():
            for key, raw in fields.items():
                number = _number(raw)
                if number is not None:
                    values.setdefault(line, {}).setdefault(key, []).append(number)
    return {
        line: {key: statistics.median(vals) for key, vals in fields.items()}
        for line, fields in values.items()
    }


def report(before: Side, after: Side, benches: Iterable[str]) -> list[str]:
    """The markdown tables: per bench and line, each numeric field's medians and ratio."""
    out: list[str] = []
    for bench in benches:
        b_runs, a_runs = before.runs.get(bench, []), after.runs.get(bench, [])
        out.append(
            f"### {bench} (runs: before {len(b_runs)}, failed {before.failed.get(bench, 0)}; "
            f"after {len(a_runs)}, failed {after.failed.get(bench, 0)})"
        )
        b_med, a_med = medians(b_runs), medians(a_runs)
        for line in sorted(set(b_med) | set(a_med)):
            out.append("")
            out.append(f"`{line}`")
            out.append("")
            out.append(
                f"| field | before {before.commit[:10]} | after {after.commit[:10]} | after ÷ before |"
            )
            out.append("|---|---|---|---|")
            b_fields, a_fields = b_med.get(line, {}), a_med.get(line, {})
            for key in sorted(set(b_fields) | set(a_fields)):
                b, a = b_fields.get(key), a_fields.get(key)
                ratio = f"{a / b:.2f}" if a is not None and b not in (None, 0) else "—"
                out.append(f"| {key} | {_fmt(b)} | {_fmt(a)} | {ratio} |")
        out.append("")
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def checkout(ref: str, workdir: Path) -> tuple[str, Path]:
    """The commit ``ref`` names and its worktree (made and bootstrapped on first use)."""
    try:
        commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"compare: {ref!r} names no commit of this repository") from None
    tree = workdir / commit[:12]
    if not (tree / ".git").exists():
        print(f"compare: worktree for {ref} ({commit[:12]}) at {tree}", file=sys.stderr)
        _git("worktree", "add", "--detach", str(tree), commit)
    if not (tree / ".venv" / "bin" / "python").exists() or not (tree / ".venv" / ".eo-installed").exists():
        print(f"compare: bootstrapping {tree} (a few minutes, first use only)", file=sys.stderr)
        subprocess.run(["scripts/bootstrap.sh"], cwd=tree, check=True)
    return commit, tree


def run_bench(tree: Path, args: Sequence[str], log: Path, timeout_s: float) -> tuple[int, str]:
    """Run one bench in ``tree`` with its own interpreter; its output goes to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                [str(tree / ".venv" / "bin" / "python"), *args],
                cwd=tree,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -1
    return code, log.read_text(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit (or branch, tag) to compare against")
    parser.add_argument("--after", default="HEAD", help="the commit to measure (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--bench", action="append", choices=sorted(BENCHES), help="a bench to run (repeatable; default: all)"
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / ".eo" / "compare")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per bench run")
    ns = parser.parse_args(argv)
    benches = ns.bench or DEFAULT_BENCHES
    sides = []
    for ref in (ns.before, ns.after):
        commit, tree = checkout(ref, ns.workdir)
        sides.append((Side(ref=ref, commit=commit), tree))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    total = ns.rounds * len(benches) * 2
    done = 0
    started = time.monotonic()
    for round_no in range(1, ns.rounds + 1):
        order = sides if round_no % 2 else list(reversed(sides))
        for bench in benches:
            for side, tree in order:
                label = "before" if side is sides[0][0] else "after"
                done += 1
                t0 = time.monotonic()
                print(
                    f"compare [{done}/{total}] round {round_no}: {bench} {label} ...",
                    file=sys.stderr,
                    flush=True,
                )
                log = ns.workdir / "logs" / stamp / f"{bench}-{label}-{round_no}.log"
                code, output = run_bench(tree, BENCHES[bench], log, ns.timeout)
                took = time.monotonic() - t0
                if code != 0:
                    side.failed[bench] = side.failed.get(bench, 0) + 1
                    print(f"compare: {bench} {label} round {round_no} exited {code} ({took:.0f}s); see {log}",
                          file=sys.stderr)  # fmt: skip
                    continue
                side.runs.setdefault(bench, []).append(parse_lines(output))
                print(f"compare: {bench} {label} round {round_no}: {took:.0f}s", file=sys.stderr)
    before, after = sides[0][0], sides[1][0]
    lines = report(before, after, benches)
    print("\n".join(lines))
    summary = ns.workdir / "logs" / stamp / "report.md"
    summary.write_text("\n".join(lines) + "\n")
    (summary.parent / "runs.json").write_text(
        json.dumps({s.ref: {"commit": s.commit, "runs": s.runs, "failed": s.failed} for s in (before, after)})
    )
    failed = sum(before.failed.values()) + sum(after.failed.values())
    print(
        f"compare: before={before.commit[:12]} after={after.commit[:12]} rounds={ns.rounds} "
        f"benches={','.join(benches)} runs={total} failed={failed} seconds={time.monotonic() - started:.0f} "
        f"report={summary}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
