"""The classpath of eo's Kafka transaction admin tool (``eo.kafka.Transactions``): the Java
client's ListTransactions, DescribeTransactions, DescribeProducers and abortTransaction, which
librdkafka lacks (see :mod:`airflow_provider_eo.kafka.transactions`).

The tool is one small class compiled against a ``kafka-clients`` jar found here, and cached
in ``<state>/jars/`` keyed by its source. ``kafka-clients`` comes from, in order:
``$EO_KAFKA_CLIENTS_JARS`` (a ``:``-separated list of jars or folders), Spark's Kafka
connector jars (``eo setup jars``), the local broker's jars (``eo dev jars``). No Maven run:
what is not there is named in the error with the command that provides it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.javac import build_jar
from airflow_provider_eo.stack.paths import state_dir

JAVA_ROOT = Path(__file__).resolve().parents[1] / "kafka" / "java"
SOURCES = (JAVA_ROOT / "eo" / "kafka" / "Transactions.java",)
TRANSACTIONS_CLASS = "eo.kafka.Transactions"
#: Jars (or folders of jars) holding ``kafka-clients`` (and ``slf4j-api``), ``:``-separated.
ENV_JARS = "EO_KAFKA_CLIENTS_JARS"


def tool_jar_path() -> Path:
    """Where the compiled tool lives once built (keyed by its source)."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:12]
    return state_dir() / "jars" / f"eo-kafka-transactions-{digest}.jar"


def _jars_in(entries: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for entry in entries:
        path = Path(entry).expanduser()
        out.extend(sorted(path.glob("*.jar")) if path.is_dir() else [path] if path.is_file() else [])
    return out


def _candidates() -> list[tuple[str, list[Path]]]:
    """(where, jars) of every place a kafka-clients jar may be, in order of preference."""
    out: list[tuple[str, list[Path]]] = []
    env = os.environ.get(ENV_JARS)
    if env:
        out.append((f"${ENV_JARS}", _jars_in([e for e in env.split(os.pathsep) if e])))
    extra: list[Path] = []
    try:
        import pyspark

        # pyspark ships slf4j-api, which kafka-clients needs and the connector folder lacks.
        extra = sorted((Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))
        version = str(pyspark.__version__)
        out.append(
            (
                f"Spark's Kafka connector jars ({version})",
                _jars_in([state_dir() / "jars" / f"spark-sql-kafka-{version}"]) + extra,
            )
        )
    except ImportError:
        pass
    from airflow_provider_eo.stack.kafka import KAFKA_VERSION

    out.append(
        (
            f"the local broker's jars ({KAFKA_VERSION})",
            _jars_in([state_dir() / "jars" / f"kafka-{KAFKA_VERSION}"]),
        )
    )
    return out


def _pick(jars: Sequence[Path]) -> list[Path]:
    """kafka-clients and slf4j-api from ``jars`` (empty when kafka-clients is missing)."""
    clients = [j for j in jars if j.name.startswith("kafka-clients-")]
    slf4j = [j for j in jars if j.name.startswith("slf4j-api-")]
    return [clients[-1], *slf4j[-1:]] if clients else []


def client_jars() -> list[Path]:
    """The kafka-clients jar (and slf4j-api) to run the tool with.

    :raises StackError: none was found; the message lists where it looked and how to fill one.
    """
    looked = []
    for where, jars in _candidates():
        picked = _pick(jars)
        if picked:
            return picked
        looked.append(where)
    raise StackError(
        "no kafka-clients jar was found for Kafka's transaction admin calls (looked in: "
        + "; ".join(looked)
        + f"). Run `eo setup jars` (Spark's Kafka connector includes kafka-clients), or set "
        f"{ENV_JARS} to the jars of a Kafka client (kafka-clients-*.jar and slf4j-api-*.jar)."
    )


def java_binary() -> str:
    """The ``java`` to run (``$JAVA_HOME/bin/java``, else the one on PATH).

    :raises StackError: no Java runtime is installed.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StackError(
            "no Java runtime (`java` on PATH or $JAVA_HOME) for Kafka's transaction admin calls: "
            "install a Java 17+ runtime (Debian: apt-get install -y openjdk-17-jre-headless)."
        )
    return found


def tool_jar(clients: Sequence[Path]) -> Path:
    """The compiled tool, built on first use (``javac`` and ``jar`` of a JDK 17+).

    :raises StackError: not built yet and no JDK here, or building it is forbidden here
        (an Airflow worker: run ``eo setup jars`` where the image is built).
    """
    out = tool_jar_path()
    if out.is_file():
        return out
    from airflow_provider_eo.stack.maven import forbid_check

    forbid_check("javac", "eo's Kafka transaction admin tool")
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise StackError(
            f"eo's Kafka transaction admin tool ({out.name}) is not built and no JDK (javac and "
            "jar on PATH) is here to build it: install a JDK 17+ (Debian: apt-get install -y "
            "openjdk-17-jdk-headless) or run `eo setup jars` where one is."
        )
    return build_jar(out, SOURCES, clients, javac=javac, jar=jar)


def admin_classpath() -> list[Path]:
    """The tool's jar and the client jars it runs with, the tool built when missing.

    :raises StackError: no kafka-clients jar, no JDK to build the tool; the message names the fix.
    """
    clients = client_jars()
    return [tool_jar(clients), *clients]


__all__ = ["ENV_JARS", "TRANSACTIONS_CLASS", "admin_classpath", "client_jars", "java_binary", "tool_jar"]
