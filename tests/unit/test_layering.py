"""The import contracts (pyproject.toml ``[tool.importlinter]``) hold for the package, and
each one fails when a module breaks it.

``lint-imports`` is the gate; the second test checks the gate itself: in a copy of the
package it adds forbidden imports, one at a time, and expects the contract against each to break.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root`` (its pyproject.toml's contracts), only
    ``contracts`` when given. The cache is off: it would be written into ``root``."""
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo"]
    for contract in contracts:
        args += ["--contract", contract]
    # PYTHONPATH first: the copy in ``root`` shadows the editable install of the checkout.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def contract_ids() -> list[str]:
    """Every contract's id, as pyproject.toml declares them."""
    return [c["id"] for c in read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]]


def test_the_package_keeps_every_import_contract() -> None:
    """The gate: every contract is kept by the package as it is."""
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(contract_ids())} kept, 0 broken." in out.stdout


# (module, an import appended to it at function level, the contract it breaks)
VIOLATIONS = [
    ("core/audit.py", "import airflow_provider_eo.spark.session", "core-below-adapters-and-airflow"),
    ("core/audit.py", "import airflow_provider_eo.operators.commit", "core-below-adapters-and-airflow"),
    ("spark/session.py", "import airflow.sdk", "spark-without-airflow"),
    ("kafka/admin.py", "from airflow_provider_eo.ledger import Ledger", "kafka-adapter"),
    ("kafka/admin.py", "import airflow_provider_eo.core.audit", "kafka-adapter"),
    ("ledger/urls.py", "import rich", "ledger-storage"),
    ("ledger/urls.py", "import airflow_provider_eo.stack.kafka", "ledger-storage"),
    ("operators/commit.py", "import airflow_provider_eo.testing.faults", "production-not-testing-or-demo"),
    ("ui/app.py", "import airflow_provider_eo.demo.sample", "production-not-testing-or-demo"),
    # kafka and stack are independent siblings of one layer
    ("stack/javac.py", "import airflow_provider_eo.kafka.client_config", "layers"),
    ("errors.py", "import airflow_provider_eo.paths", "layers"),
    # ledger.records imports ledger.states: the reverse closes a cycle inside the ledger
    ("ledger/states.py", "import airflow_provider_eo.ledger.records", "no-cycles"),
]


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package and its pyproject.toml (the contracts), which keeps every
    contract as the original does: a probe's failure is then the probe's doing."""
    root = tmp_path_factory.mktemp("layering")
    shutil.copytree(
        ROOT / "airflow_provider_eo",
        root / "airflow_provider_eo",
        ignore=shutil.ignore_patterns("__pycache__", "*.jar", "java"),
    )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    out = lint_imports(root)
    assert out.returncode == 0, out.stdout + out.stderr
    return root


@pytest.mark.parametrize(("module", "statement", "contract"), VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(
    package_copy: Path, module: str, statement: str, contract: str
) -> None:
    """One added import, inside a function (import-linter reads those too), breaks the
    contract that forbids it."""
    path = package_copy / "airflow_provider_eo" / module
    pristine = path.read_text()
    path.write_text(f"{pristine}\n\ndef _layering_probe() -> None:\n    {statement}\n")
    try:
        out = lint_imports(package_copy, contract)
    finally:
        path.write_text(pristine)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "0 kept, 1 broken" in out.stdout, out.stdout
