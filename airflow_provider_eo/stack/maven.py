"""Fetch jars from Maven Central with the poms kept in this package, cached after the first run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.paths import state_dir

POM_DIR = Path(__file__).resolve().parent / "maven"


#: Set (to anything) where no build tool may run: Airflow workers. The tests set it for
#: every Airflow task they run, so a task that would run Maven or javac fails loudly.
FORBID_ENV = "EO_FORBID_BUILD_TOOLS"


def forbid_check(tool: str, what: str) -> None:
    """Refuse to run ``tool`` when :data:`FORBID_ENV` is set (a StackError naming the fix)."""
    if os.environ.get(FORBID_ENV):
        raise StackError(
            f"{what} is not installed here and would need {tool}, which may not run here "
            f"({FORBID_ENV} is set: an Airflow task never runs a build tool). Run `eo setup jars` "
            "where the jars are built (image build, deploy step), or give the connector through "
            "the task's packages/jars."
        )


def _require(tool: str, how: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise StackError(f"`{tool}` was not found on PATH; {how}")
    return path


def _copy_dependencies(pom: str, out: Path, props: dict[str, str], what: str) -> list[Path]:
    """Run ``mvn dependency:copy-dependencies`` once into ``out``; later calls reuse it."""
    cached = _cached_dependencies(out)
    if cached is not None:
        return cached
    forbid_check("Maven", what)
    done = out / ".complete"
    mvn = _require("mvn", "install Maven (Debian: apt-get install -y maven) and retry.")
    _require("java", "install a Java 17+ runtime (Debian: apt-get install -y openjdk-17-jre-headless).")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(POM_DIR / pom / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
        *(f"-D{k}={v}" for k, v in props.items()),
    ]
    print(f"eo: fetching {what} from Maven Central (first run only) ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise StackError(
            f"Maven could not fetch {what} (exit {proc.returncode}). Check that Maven Central is "
            f"reachable and ~/.m2/settings.xml is sane, then retry.\n{tail}"
        )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    done.write_text(f"{time.time()}\n")
    jars = sorted(out.glob("*.jar"))
    print(
        f"eo: fetched {len(jars)} jars for {what} in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    return jars


def _cached_dependencies(out: Path) -> list[Path] | None:
    """The jars a completed fetch left in ``out``; None when none completed."""
    return sorted(out.glob("*.jar")) if (out / ".complete").is_file() else None


def cached_spark_kafka_jars(spark_version: str) -> list[Path] | None:
    """The connector jars for ``spark_version`` when already fetched (``eo setup jars``,
    ``eo dev jars``, the bootstrap); None otherwise. Never runs Maven."""
    return _cached_dependencies(state_dir() / "jars" / f"spark-sql-kafka-{spark_version}")


def kafka_broker_jars(kafka_version: str) -> list[Path]:
    """The Kafka broker's classpath (server, clients, Scala, log4j2), fetched once."""
    out = state_dir() / "jars" / f"kafka-{kafka_version}"
    return _copy_dependencies(
        "kafka-broker", out, {"kafka.version": kafka_version}, f"Apache Kafka {kafka_version}"
    )


def installed_spark_version() -> str:
    """The installed pyspark's version (the connector must match it exactly)."""
    import pyspark

    return str(pyspark.__version__)


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """``spark-sql-kafka-0-10_2.13`` at the installed pyspark version, with the runtime
    dependencies Spark does not already ship."""
    version = spark_version or installed_spark_version()
    out = state_dir() / "jars" / f"spark-sql-kafka-{version}"
    return _copy_dependencies(
        "spark-kafka", out, {"spark.version": version}, f"spark-sql-kafka-0-10 {version}"
    )


def spark_hadoop_version() -> str:
    """The Hadoop version pyspark ships (from its ``jars/hadoop-client-api-<version>.jar``):
    Hadoop's S3A connector must match it exactly."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        return jar.name[len("hadoop-client-api-") : -len(".jar")]
    raise StackError(
        f"no hadoop-client-api-*.jar in {jars}: this pyspark ships no Hadoop (a 'without hadoop' "
        "build); put Hadoop's S3A connector (hadoop-aws) of your Hadoop on Spark's classpath yourself"
    )


def cached_hadoop_aws_jars(hadoop_version: str | None = None) -> list[Path] | None:
    """Hadoop's S3A connector and its AWS SDK bundle at pyspark's Hadoop version when already
    fetched (``eo setup jars --s3``, the bootstrap); None otherwise (or when pyspark ships no
    Hadoop). Never runs Maven."""
    try:
        version = hadoop_version or spark_hadoop_version()
    except StackError:
        return None
    return _cached_dependencies(state_dir() / "jars" / f"hadoop-aws-{version}")


def hadoop_aws_jars(hadoop_version: str | None = None) -> list[Path]:
    """Hadoop's S3A connector (``org.apache.hadoop:hadoop-aws``) at pyspark's Hadoop version,
    with the AWS SDK bundle it was released with, fetched once: what Spark needs to stage
    under ``s3a://`` when its image does not have it already."""
    version = hadoop_version or spark_hadoop_version()
    out = state_dir() / "jars" / f"hadoop-aws-{version}"
    return _copy_dependencies("hadoop-aws", out, {"hadoop.version": version}, f"hadoop-aws {version}")


def hadoop_minicluster_jars(hadoop_version: str | None = None) -> list[Path]:
    """Hadoop's own test cluster (``org.apache.hadoop:hadoop-client-minicluster``: a
    MiniYARNCluster and a MiniDFSCluster) at pyspark's Hadoop version, with the few jars it
    needs and does not shade, fetched once: what the tests run Spark on YARN with."""
    version = hadoop_version or spark_hadoop_version()
    out = state_dir() / "jars" / f"hadoop-minicluster-{version}"
    return _copy_dependencies(
        "hadoop-minicluster", out, {"hadoop.version": version}, f"hadoop-client-minicluster {version}"
    )
