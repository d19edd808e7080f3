"""Compile the JVM half of eo's Spark functions (one small class) into a jar, cached.

The jar holds ``eo.spark.KafkaPartition`` (the Java client's murmur2 partitioner as a Spark
SQL function); it is compiled against the installed pyspark's own ``spark-sql-api`` jar, so
no download is needed, and lives in ``<state>/jars/`` keyed by the source and pyspark version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.paths import state_dir

JAVA_ROOT = Path(__file__).resolve().parents[1] / "spark" / "java"
SOURCES = (JAVA_ROOT / "eo" / "spark" / "KafkaPartition.java",)
KAFKA_PARTITION_CLASS = "eo.spark.KafkaPartition"


def udf_jar_path(spark_version: str) -> Path:
    """Where the partitioner jar for this source and ``spark_version`` lives once built."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + spark_version.encode())
    return state_dir() / "jars" / f"eo-spark-udfs-{digest.hexdigest()[:12]}.jar"


def cached_udf_jar(spark_version: str) -> Path | None:
    """The partitioner jar when already built (``eo setup jars``); never compiles."""
    out = udf_jar_path(spark_version)
    return out if out.is_file() else None


def udf_jar() -> Path | None:
    """The jar with :data:`KAFKA_PARTITION_CLASS`, compiled on first use.

    ``None`` (with a note on stderr) when no JDK (``javac`` and ``jar``) is on PATH: the
    prepare step then assigns partitions with a Python (Arrow) UDF instead, same result,
    slower. A compile error is a :class:`StackError` (a bug of this package, not the user's).
    """
    import pyspark

    out = udf_jar_path(pyspark.__version__)
    if out.is_file():
        return out
    from airflow_provider_eo.stack.maven import forbid_check

    forbid_check("javac", "eo's JVM partitioner jar")
    javac, jar = shutil.which("javac"), shutil.which("jar")
    api = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql-api_*.jar"))
    if javac is None or jar is None or not api:
        missing = "no JDK (javac and jar on PATH)" if api else "pyspark's spark-sql-api jar is missing"
        print(
            f"eo: {missing}: sink partitions are computed by a Python UDF (slower). "
            "Install a JDK 17+ (Debian: apt-get install -y openjdk-17-jdk-headless) to compile "
            "the JVM one.",
            file=sys.stderr,
        )
        return None
    return build_jar(out, SOURCES, [api[0]], javac=javac, jar=jar)


def build_jar(out: Path, sources: Sequence[Path], classpath: Sequence[Path], *, javac: str, jar: str) -> Path:
    """Compile ``sources`` against ``classpath`` (Java 17) into the jar ``out``, replaced
    atomically (a concurrent build just wins or loses the rename).

    :raises StackError: javac or jar failed; the message holds their output.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        classes = Path(tmp) / "classes"
        built = Path(tmp) / out.name
        cp = os.pathsep.join(str(p) for p in classpath)
        for cmd in (
            [javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(classes), *map(str, sources)],
            [jar, "cf", str(built), "-C", str(classes), "."],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise StackError(
                    f"building {out.name} failed ({Path(cmd[0]).name} exit {proc.returncode}):\n"
                    f"{proc.stdout}{proc.stderr}"
                )
        os.replace(built, out)
    return out
