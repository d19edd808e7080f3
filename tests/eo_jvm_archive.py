"""A class-data-sharing archive for the Spark JVMs the tests start (``python tests/eo_jvm_archive.py``).

Every ``eo`` child, every spark-submit and every test session starts a Spark driver JVM that
loads and verifies the same ~10,000 classes of pyspark's jars. A dynamic CDS archive
(``-XX:ArchiveClassesAtExit``, JDK 13+) made once from a short representative job maps them
in already parsed: a cold local session plus its first job takes about half the time.

The archive is cached under ``.eo/jvm`` by the Java runtime, pyspark's version and its jar
list; ``scripts/test.sh`` makes it before the test run, and ``tests/conftest.py`` hands it to
every Spark JVM through ``SPARK_SUBMIT_OPTS`` when it is there. The JVM checks that an archive
fits (same runtime, a class path the archive's is a prefix of) and ignores one that does not;
its messages about that are turned off, so a child's stdout stays the child's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE_DIR = ROOT / ".eo" / "jvm"
#: The JVM options the tests' Spark drivers run with: the client JIT only (no C2 compiler
#: threads taking the cores of a small shared machine; a cold local job is a third faster).
BASE_OPTS = "-XX:TieredStopAtLevel=1"
#: Any JVM the tests start that lives minutes (brokers, cluster daemons, executors, YARN's
#: application master): the client JIT only and the serial collector start it fastest.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Every executor those drivers start on a test cluster (standalone, YARN) runs a few short
#: tasks too: the same JIT and the serial collector. A Spark property the driver reads from
#: its JVM's system properties (quoted: the launcher keeps it one argument). Not through a
#: conf folder: Spark puts that first on the class path, and a class path with a non-empty
#: folder in it can neither make nor map an archive.
EXECUTOR_OPTS = f'"-Dspark.executor.defaultJavaOptions={SHORT_LIVED_JVM}"'
#: Silence the JVM's notes about the archive (a mismatch or a skipped class) on stdout.
QUIET = "-Xlog:cds*=off"

# The job whose classes go into the archive: what the tests' drivers do (a session with the
# Kafka connector jars, shuffles, Python UDFs, Arrow both ways, Parquet and JSON files).
WORKLOAD = """
import sys, tempfile
from airflow_provider_eo.spark.session import get_spark
from pyspark.sql import functions as F
spark = get_spark("eo-class-archive")
df = spark.range(2000).selectExpr(
    "id % 7 AS k", "CAST(id AS STRING) AS value", "encode(CAST(id AS STRING), 'utf-8') AS b"
)
df.groupBy("k").agg(F.count("*"), F.max("value")).collect()
df.select(F.udf(lambda v: v + "!")("value")).collect()
def batches(it):
    yield from it
pdf = df.mapInArrow(batches, df.schema).toPandas()
spark.createDataFrame(pdf).repartition(2).sortWithinPartitions("k").collect()
with tempfile.TemporaryDirectory() as d:
    df.write.parquet(d + "/p")
    spark.read.parquet(d + "/p").where("k = 1").count()
    df.select(F.to_json(F.struct("k", "value")).alias("j")).write.text(d + "/j")
    spark.read.json(d + "/j").collect()
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the gateway JVM's signal to exit; it writes the archive as it does
jvm.wait()
"""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(java) if java else ""


def spark_home_bin() -> Path:
    """pyspark's ``bin`` folder (spark-submit, spark-class)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin"


def archive_path() -> Path | None:
    """Where this runtime's and this pyspark's archive lives (None without Java or pyspark)."""
    try:
        import pyspark
    except ImportError:
        return None
    java = _java()
    if not java:
        return None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar"))
    key = hashlib.sha256("\n".join([java, pyspark.__version__, *names]).encode()).hexdigest()[:16]
    return ARCHIVE_DIR / f"spark-{key}.jsa"


def spark_submit_opts() -> str:
    """``SPARK_SUBMIT_OPTS`` for the tests' Spark drivers: with the archive when it is made."""
    archive = archive_path()
    if archive is None or not archive.is_file():
        return f"{BASE_OPTS} {EXECUTOR_OPTS}"
    return f"{BASE_OPTS} {EXECUTOR_OPTS} -XX:SharedArchiveFile={archive} {QUIET}"


def make_archive(timeout_s: float = 600) -> Path | None:
    """Make the archive unless it is there; returns its path (None when it cannot be made)."""
    archive = archive_path()
    if archive is None or archive.is_file():
        return archive
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    for old in ARCHIVE_DIR.glob("spark-*.jsa"):  # another runtime's or pyspark's
        old.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=ARCHIVE_DIR) as work:
        partial = Path(work) / archive.name
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_SUBMIT_OPTS": f"{BASE_OPTS} -XX:ArchiveClassesAtExit={partial} {QUIET}",
        }
        log = Path(work) / "dump.log"
        with log.open("wb") as out:
            try:
                done = subprocess.run(
                    [sys.executable, "-c", WORKLOAD],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout_s,
                )
            except subprocess.TimeoutExpired:  # the tests run without it, only slower
                done = None
        if done is None or done.returncode != 0 or not partial.is_file():
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            return None
        partial.replace(archive)  # whole or not at all: a concurrent reader never maps half
    return archive


if __name__ == "__main__":
    made = make_archive()
    print(f"Spark class archive: {made or 'not made (no Java or pyspark, or the job failed)'}")
