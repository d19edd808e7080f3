"""Every test docs/design.md names (its recovery table above all) exists: a renamed or
removed test must take its row along."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_the_design_names_exists() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    missing, named, last = [], 0, None
    for m in re.finditer(r"`(tests/[^`:]+\.py)(?:::([A-Za-z0-9_]+))?[^`]*`|`::([A-Za-z0-9_]+)`", text):
        path, function = (m.group(1), m.group(2)) if m.group(1) else (last, m.group(3))
        last = path
        named += 1
        source = ROOT / str(path)
        if not source.is_file():
            missing.append(str(path))
        elif function and not re.search(rf"def {function}\b", source.read_text()):
            missing.append(f"{path}::{function}")
    assert named > 50, named  # the table is still there
    assert missing == [], missing
