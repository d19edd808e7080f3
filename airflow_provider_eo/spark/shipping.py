"""Shipping the user's code to Spark executors.

A pipeline module and its transform usually live next to the DAGs (or in a package of the
team's own), not on the Spark nodes. A transform with a Python UDF is pickled by reference
to its module, so every executor must import that module: without it, each prepare fails
with ``ModuleNotFoundError`` on the executors. The submit operators therefore add the
user's modules to ``py_files`` (spark-submit ``--py-files``): a single-file module as the
``.py`` file itself, a package as a zip of its top-level package folder.

Modules installed in the interpreter (site-packages: pyspark, the team's installed
libraries) and this provider itself are not shipped; they must be installed on the
cluster as well.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

#: Folder names under which a module counts as installed, not user code.
_INSTALLED_MARKERS = ("site-packages", "dist-packages")


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths]


def user_module_source(module: str) -> Path | None:
    """The file (single-file module) or top-level package folder of ``module`` when it is
    user code to ship; ``None`` when it is installed (site-packages, the standard library),
    built in, or cannot be found."""
    top = module.split(".", 1)[0]
    if top == "airflow_provider_eo":
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    origin = Path(spec.origin).resolve()
    if any(marker in origin.parts for marker in _INSTALLED_MARKERS):
        return None
    if any(origin.is_relative_to(root) for root in _installed_roots()):
        return None
    if origin.name == "__init__.py":
        return origin.parent
    return origin if origin.suffix == ".py" else None


def default_ship_dir() -> Path:
    """Where packages are zipped for shipping: one folder per user under the temp dir."""
    return Path(tempfile.gettempdir()) / f"eo-py-files-{os.getuid()}"


def _zip_package(folder: Path, dest: Path) -> Path:
    """``dest/<digest>/<package>.zip`` holding ``<package>/...`` (Python files and data, no
    caches). Content-addressed: the same code reuses its zip, changed code gets a new one,
    and a zip a running application still serves is never rewritten."""
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    ]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    target = dest / digest.hexdigest()[:16] / f"{folder.name}.zip"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".zip.{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            zf.write(path, Path(folder.name) / path.relative_to(folder))
    os.replace(partial, target)  # atomic: a concurrent task sees a whole zip or none
    return target


def ship_py_files(refs: Iterable[str | None], dest: Path | None = None) -> list[str]:
    """The ``py_files`` entries that carry the user modules of ``refs`` (``"module:attr"``
    references such as the pipeline and its transform) to the executors; packages are
    zipped under ``dest`` (default :func:`default_ship_dir`). Installed modules are left
    out; each module is shipped once."""
    dest = dest or default_ship_dir()
    shipped: list[str] = []
    seen: set[Path] = set()
    for ref in refs:
        if not ref:
            continue
        source = user_module_source(ref.split(":", 1)[0])
        if source is None or source in seen:
            continue
        seen.add(source)
        if source.is_dir():
            shipped.append(str(_zip_package(source, dest)))
        else:
            shipped.append(str(source))
    return shipped
