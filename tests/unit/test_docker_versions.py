"""The images in docker/ are the versions the tests run against: a drift fails here.

- Kafka image tag = ``airflow_provider_eo.stack.KAFKA_VERSION`` (the broker the tests fetch
  from Maven Central);
- Spark image tags = the installed ``pyspark`` (the connector and eo's jar are built for it);
- the Airflow base image = the installed ``apache-airflow`` on this Python's major.minor, and
  the Dockerfile pins ``apache-airflow`` to it when installing the provider;
- the PostgreSQL image's major = the server the tests start (``scripts/postgres.sh``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_eo.stack import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "docker-compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile.airflow"


def _images(compose: dict[str, Any]) -> dict[str, str]:
    """service -> image, for the services that name an upstream image (not our build)."""
    return {
        name: svc["image"]
        for name, svc in compose["services"].items()
        if "image" in svc and "build" not in svc
    }


def _tag(image: str, repo: str) -> str:
    name, _, tag = image.partition(":")
    assert name == repo, f"expected an {repo} image, got {image}"
    return tag


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_kafka_image_is_the_tests_broker(compose: dict[str, Any]) -> None:
    assert _tag(compose["services"]["kafka"]["image"], "apache/kafka") == KAFKA_VERSION


def test_spark_images_are_the_installed_pyspark(compose: dict[str, Any]) -> None:
    spark = {name: image for name, image in _images(compose).items() if image.startswith("apache/spark")}
    assert set(spark) == {"spark-master", "spark-worker"}
    for image in spark.values():
        assert _tag(image, "apache/spark") == version("pyspark")


def test_airflow_image_is_the_installed_airflow_on_this_python() -> None:
    text = DOCKERFILE.read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert bases == [f"apache/airflow:{version('apache-airflow')}-python{py}"]
    pins = re.findall(r"apache-airflow==([0-9][^\"'\s]*)", text)
    assert pins == [version("apache-airflow")], "pip install must pin apache-airflow to the image's"


def test_every_airflow_service_builds_the_one_image(compose: dict[str, Any]) -> None:
    ours = {n: s for n, s in compose["services"].items() if n.startswith("airflow-") or n == "eo-topics"}
    assert ours and all(s["build"]["dockerfile"] == "docker/Dockerfile.airflow" for s in ours.values())


def _tests_postgres_major() -> int | None:
    """The major of the server scripts/postgres.sh starts (same search order), None if none."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(bindir.stdout.strip()))
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)],
        reverse=True,
    )
    for bindir in candidates:
        initdb = bindir / "initdb"
        if initdb.is_file():
            out = subprocess.run([str(initdb), "--version"], capture_output=True, text=True, check=True)
            match = re.search(r"\(PostgreSQL\)\s+(\d+)", out.stdout)
            return int(match.group(1)) if match else None
    # Not installed yet (a fresh machine before the first PostgreSQL test): the major that
    # scripts/postgres.sh would install, Debian's `postgresql` package (version "15+248").
    if shutil.which("apt-cache"):
        policy = ["apt-cache", "policy", "postgresql"]
        out = subprocess.run(policy, capture_output=True, text=True, check=False)
        match = re.search(r"Candidate:\s+(\d+)\+", out.stdout)
        if match:
            return int(match.group(1))
    return None


def test_postgres_image_is_the_tests_major(compose: dict[str, Any]) -> None:
    major = _tests_postgres_major()
    if major is None:
        pytest.skip("no PostgreSQL installed, and no apt-cache to tell which scripts/postgres.sh installs")
    assert _tag(compose["services"]["postgres"]["image"], "postgres") == str(major)
