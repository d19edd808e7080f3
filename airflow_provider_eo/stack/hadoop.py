"""Hadoop's own test cluster on 127.0.0.1: a MiniDFSCluster and a MiniYARNCluster in one JVM.

What the tests run Spark on YARN (client and cluster deploy mode) and stage on HDFS against:
``org.apache.hadoop:hadoop-client-minicluster`` at pyspark's Hadoop version, from Maven
Central (:func:`~airflow_provider_eo.stack.maven.hadoop_minicluster_jars`), started by a small
Java main (``stack/java/eo/hadoop/MiniCluster.java``, compiled on first use like eo's Spark
partitioner). Once both serve, its ``conf`` folder is a ``HADOOP_CONF_DIR`` for clients
(``core-site.xml`` with ``fs.defaultFS``, ``hdfs-site.xml`` with the NameNode's HTTP address,
``yarn-site.xml`` with the ResourceManager's addresses).

The NodeManager runs its containers on this machine, as child processes of the cluster's JVM
in sessions of their own; :meth:`MiniHadoop.down` stops the JVM (which stops YARN and so its
containers), then kills whatever process still runs in the cluster's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_eo.processes import pid_alive
from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.paths import state_dir

JAVA_ROOT = Path(__file__).resolve().parent / "java"
SOURCES = (JAVA_ROOT / "eo" / "hadoop" / "MiniCluster.java",)
MAIN_CLASS = "eo.hadoop.MiniCluster"
LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j.properties"


def minicluster_classpath() -> list[Path]:
    """The mini cluster's jars (fetched once) and its launcher class (compiled once)."""
    from airflow_provider_eo.stack.javac import build_jar
    from airflow_provider_eo.stack.maven import forbid_check, hadoop_minicluster_jars

    jars = hadoop_minicluster_jars()
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + jars[0].parent.name.encode())
    out = state_dir() / "jars" / f"eo-minicluster-{digest.hexdigest()[:12]}.jar"
    if not out.is_file():
        forbid_check("javac", "eo's Hadoop mini cluster launcher")
        javac, jar = shutil.which("javac"), shutil.which("jar")
        if javac is None or jar is None:
            raise StackError(
                "the Hadoop mini cluster needs a JDK (javac and jar on PATH): "
                "apt-get install -y openjdk-17-jdk-headless"
            )
        build_jar(out, SOURCES, jars, javac=javac, jar=jar)
    return [out, *jars]


def read_site(path: Path) -> dict[str, str]:
    """The properties of a Hadoop ``*-site.xml`` file."""
    root = ET.parse(path).getroot()
    return {(prop.findtext("name") or ""): (prop.findtext("value") or "") for prop in root.iter("property")}


@dataclass(frozen=True)
class HadoopInfo:
    """Where the running mini cluster answers."""

    pid: int
    conf_dir: Path
    default_fs: str
    rm_address: str
    rm_web: str
    webhdfs: str

    def rm_rest(self, path: str) -> Any:
        """GET ``http://<ResourceManager web>/ws/v1/cluster/<path>`` as JSON."""
        url = f"http://{self.rm_web}/ws/v1/cluster/{path.lstrip('/')}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def applications(self) -> list[dict[str, Any]]:
        """The ResourceManager's view of every application (``/ws/v1/cluster/apps``)."""
        apps = (self.rm_rest("apps").get("apps") or {}).get("app") or []
        return list(apps)


class MiniHadoop:
    """Start and stop one mini cluster whose state lives in ``home``.

    :param home: its folder (HDFS data, YARN's work and container logs, ``conf``).
    :param memory_mb: memory the NodeManager offers to containers.
    :param vcores: virtual cores the NodeManager offers.
    """

    def __init__(self, home: Path, *, memory_mb: int = 6144, vcores: int = 8) -> None:
        self.home = home.resolve()
        self.memory_mb = memory_mb
        self.vcores = vcores
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def conf_dir(self) -> Path:
        """The ``HADOOP_CONF_DIR`` the cluster writes once it serves."""
        return self.home / "conf"

    def up(self, *, timeout_s: float = 180.0) -> HadoopInfo:
        """Start the cluster and wait until it serves (its ``conf/ready`` file)."""
        java = shutil.which("java")
        if java is None:
            raise StackError("`java` was not found on PATH; the Hadoop mini cluster needs Java 17+")
        classpath = os.pathsep.join(str(p) for p in minicluster_classpath())
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.conf_dir, ignore_errors=True)
        work = self.home / "work"
        work.mkdir(exist_ok=True)
        # A cluster node's environment: nothing of this process (no PYTHONPATH, no AIRFLOW_*,
        # no credentials) reaches the containers through the NodeManager.
        env = {k: os.environ[k] for k in ("PATH", "JAVA_HOME", "LANG", "TZ") if k in os.environ}
        env["HOME"] = str(work)
        log = (self.home / "stdout.log").open("ab")
        self._proc = subprocess.Popen(
            [
                java,
                "-Xmx1g",
                "-XX:+UseSerialGC",
                "-Djava.awt.headless=true",
                f"-Dlog4j.configuration=file:{LOG4J_CONFIG}",
                "-cp",
                classpath,
                MAIN_CLASS,
                str(self.conf_dir),
                str(self.home / "data"),
                str(self.memory_mb),
                str(self.vcores),
            ],
            cwd=work,  # MiniYARNCluster keeps its folders under ./target
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not (self.conf_dir / "ready").is_file():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.down()
                raise StackError(f"the Hadoop mini cluster did not start within {timeout_s:.0f}s:\n{tail}")
            time.sleep(0.5)
        return self.info()

    def info(self) -> HadoopInfo:
        """The running cluster's addresses (from the files it wrote)."""
        if self._proc is None:
            raise StackError("the Hadoop mini cluster is not running")
        core = read_site(self.conf_dir / "core-site.xml")
        yarn = read_site(self.conf_dir / "yarn-site.xml")
        hdfs = read_site(self.conf_dir / "hdfs-site.xml")
        return HadoopInfo(
            pid=self._proc.pid,
            conf_dir=self.conf_dir,
            default_fs=core["fs.defaultFS"],
            rm_address=yarn["yarn.resourcemanager.address"],
            rm_web=yarn["yarn.resourcemanager.webapp.address"],
            webhdfs=hdfs["dfs.namenode.http-address"],
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the cluster JVM's output."""
        path = self.home / "stdout.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""

    def container_logs(self) -> dict[str, str]:
        """Every container's ``stdout``/``stderr`` by path (relative to the cluster's folder)."""
        return {
            str(p.relative_to(self.home)): p.read_text(errors="replace")
            for p in sorted(self.home.glob("work/target/**/application_*/container_*/std*"))
        }

    def down(self, *, timeout_s: float = 30.0) -> None:
        """Stop the cluster: SIGTERM to its process group (YARN stops its containers, then
        HDFS stops), SIGKILL after ``timeout_s``; then SIGKILL any process still running in
        the cluster's folder (a container YARN did not get to). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for pid in self._pids_inside():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _pids_inside(self) -> list[int]:
        """Processes (other than this one) whose working folder is in the cluster's folder."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cwd = Path(os.readlink(entry / "cwd"))
            except OSError:
                continue
            if (cwd == self.home or self.home in cwd.parents) and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        return found
