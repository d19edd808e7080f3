"""Which user modules the submit operators ship to the executors, and how."""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_eo.spark.shipping import ship_py_files, user_module_source


@pytest.fixture()
def user_code(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "dags"
    (root / "acme_pkg" / "sub").mkdir(parents=True)
    (root / "acme_pkg" / "__init__.py").write_text("")
    (root / "acme_pkg" / "sub" / "__init__.py").write_text("")
    (root / "acme_pkg" / "sub" / "enrich.py").write_text("def fn(df):\n    return df\n")
    (root / "acme_pkg" / "__pycache__").mkdir()
    (root / "acme_pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    (root / "acme_pipes.py").write_text("P = 1\n")
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith(("acme_pkg", "acme_pipes"))]:
            del sys.modules[name]


def test_single_file_module_ships_as_itself_and_package_as_zip(user_code: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ship"
    files = ship_py_files(["acme_pipes:P", "acme_pkg.sub.enrich:fn", "acme_pkg.sub.enrich:other"], dest)
    (zipped,) = dest.glob("*/acme_pkg.zip")
    assert files == [str(user_code / "acme_pipes.py"), str(zipped)]
    with zipfile.ZipFile(zipped) as zf:
        assert sorted(zf.namelist()) == [
            "acme_pkg/__init__.py",
            "acme_pkg/sub/__init__.py",
            "acme_pkg/sub/enrich.py",
        ]


@pytest.mark.parametrize(
    "module", ["json", "pyspark.sql", "airflow_provider_eo.examples.transforms", "no_such_mod_x"]
)
def test_installed_standard_and_missing_modules_are_not_shipped(module: str) -> None:
    assert user_module_source(module) is None


def test_none_refs_are_skipped(tmp_path: Path) -> None:
    assert ship_py_files([None, "", "json:loads"], tmp_path) == []


def test_zips_are_content_addressed(user_code: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ship"
    (first,) = ship_py_files(["acme_pkg:x"], dest)
    assert ship_py_files(["acme_pkg:x"], dest) == [first]  # same code: same zip, not rewritten
    (user_code / "acme_pkg" / "sub" / "enrich.py").write_text("def fn(df):\n    return df.limit(1)\n")
    (second,) = ship_py_files(["acme_pkg:x"], dest)
    assert second != first and Path(first).is_file()  # a running app's zip stays
