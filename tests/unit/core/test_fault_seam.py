"""The fault-injection seam: off unless a test asks for it (``EO_FAULT``), and then it fires.

Production processes import the protocol modules and pass every fault point; without
``EO_FAULT`` they must never load :mod:`airflow_provider_eo.testing` nor stop.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from airflow_provider_eo.testing.faults import STEPS

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_provider_eo"
_SEAM_CALL = re.compile(r"\bfault_(?:point|triggered)\(\s*\"([^\"]+)\"")


def seam_users() -> list[str]:
    """The production modules that import the seam (found in the source, so a new one counts)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if rel.parts[1] in ("testing", "demo") or "core.fault_seam import" not in path.read_text():
            continue
        found.append(".".join(rel.parts))
    return found


def run_child(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with exactly ``env`` (plus the parent's, minus EO_FAULT*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EO_FAULT")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_eo_fault_no_step_fires_and_testing_stays_unloaded() -> None:
    """Every fault point and every simulated failure is passed, in a process that imported the
    CLI and every module using the seam: nothing fires, and the test package is never loaded."""
    code = (
        "import importlib, json, sys\n"
        "modules, steps = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "for m in modules: importlib.import_module(m)\n"
        "from airflow_provider_eo.core.fault_seam import fault_point, fault_triggered\n"
        "for step in steps:\n"
        "    fault_point(step)\n"
        "    assert fault_triggered(step) is False, step\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('airflow_provider_eo.testing'))))\n"
    )
    modules = ["airflow_provider_eo.cli", *seam_users()]
    assert "airflow_provider_eo.core.commit" in modules
    # A fault that did fire would kill the child (EO_FAULT_ACTION's default) or exit 3.
    out = run_child(code, {"EO_FAULT_ACTION": "exit"}, json.dumps(modules), json.dumps(sorted(STEPS)))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    assert "injected fault" not in out.stderr


def test_with_eo_fault_the_named_step_fires() -> None:
    """The control for the test above: asked for, the same seam stops the process at the step
    (exit 3) and simulates a failure once."""
    code = (
        "import json, sys\n"
        "from airflow_provider_eo.core.fault_seam import fault_point\n"
        "for step in json.loads(sys.argv[1]): fault_point(step)\n"
    )
    steps = [*sorted(STEPS - {"prepare.after_write"}), "prepare.after_write"]
    out = run_child(code, {"EO_FAULT": "prepare.after_write", "EO_FAULT_ACTION": "exit"}, json.dumps(steps))
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("injected fault at") == 1
    assert "injected fault at prepare.after_write: exit" in out.stderr

    once = (
        "from airflow_provider_eo.core.fault_seam import fault_triggered as t\n"
        "print(t('commit.ambiguous_after'), t('commit.ambiguous_after'))\n"
    )
    out = run_child(once, {"EO_FAULT": "commit.ambiguous_after", "EO_FAULT_ACTION": "raise"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_every_step_is_a_fault_point_of_the_protocol() -> None:
    """``STEPS`` names exactly the steps the package's code reaches: a misspelt step at a call
    site (or a step left without one) would make a fault test pass without injecting anything."""
    called = set()
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name != "testing" and path.name != "fault_seam.py":
            called |= set(_SEAM_CALL.findall(path.read_text()))
    assert called == STEPS
