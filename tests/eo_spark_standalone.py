"""A Spark standalone cluster on 127.0.0.1 for the cluster tests: one master and one worker
started from the installed Spark distribution (pyspark's ``bin/spark-class``), executors in
their own JVMs with their own Python workers.

The worker runs with a clean environment: no test folder and no pipeline module on its
``PYTHONPATH``, as on a real cluster node, so whatever the executors import must be
installed there (the provider, from the venv) or shipped with the job (``py_files``).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from eo_harness import poll_until, wait_for
from eo_jvm_archive import SHORT_LIVED_JVM

from airflow_provider_eo.stack.kafka import free_port, free_ports, pid_alive


def spark_home() -> Path:
    """The installed Spark distribution: pyspark's package folder (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """``spark-class org.apache.spark.deploy.master.Master`` and one ``...worker.Worker``."""

    def __init__(self, home: Path, *, cores: int = 2, memory: str = "1g") -> None:
        self.home = home
        self.cores = cores
        self.memory = memory
        self.port = self.ui_port = self.worker_ui_port = 0
        self.extra_ports: list[int] = []
        self._pick_ports()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        # A cluster node's environment: this venv's Python (pyspark, pyarrow, the provider
        # installed in it) but no PYTHONPATH pointing at the tests or a DAGs folder.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.home / "logs"),
            SPARK_WORKER_DIR=str(self.home / "work"),
            # The master's REST submission server is on by default, on one fixed port (6066):
            # a second cluster on the machine (another test process) failed to bind it, and a
            # master whose REST server fails to start never leaves STANDBY. Off here; a
            # cluster that needs it sets it on, on a port of its own.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            PYSPARK_PYTHON=sys.executable,
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            # A port taken since it was picked (another test session on the machine) fails
            # the daemon instead of moving it to the next port, where it would not be found.
            # The client JIT and the serial collector: two daemons that live a few minutes.
            SPARK_DAEMON_JAVA_OPTS=" ".join(
                filter(
                    None,
                    [
                        env.get("SPARK_DAEMON_JAVA_OPTS"),
                        f"-Dspark.port.maxRetries=0 {SHORT_LIVED_JVM}",
                    ],
                )
            ),
        )
        return env

    def _start(self, name: str, *args: str, private: tuple[Path, ...] = ()) -> None:
        log = (self.home / f"{name}.log").open("ab")
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        if private:
            # Its own mount namespace with an empty tmpfs over each folder: what it (and its
            # executors) write there no other process sees, as on a second host's local disk.
            mounts = " && ".join(f"mount -t tmpfs eo-private {shlex.quote(str(d))}" for d in private)
            script = f'{mounts} && exec "$@"'
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]
        proc = subprocess.Popen(
            cmd,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def _master_status(self) -> str | None:
        """This cluster's master's status (``ALIVE``, ``STANDBY``...), or None while nothing
        answers on its UI port as this master (another process may hold the port)."""
        try:
            state = self.state()
        except (OSError, ValueError):
            return None
        return str(state.get("status")) if state.get("url") == self.master_url else None

    #: How many more ports a subclass needs (``extra_ports``), picked with the others.
    EXTRA_PORTS = 0

    def _pick_ports(self) -> None:
        """New, distinct ports for the master, its UI, the worker's UI and the extras (one
        free port after another may be the same port twice)."""
        ports = free_ports(3 + self.EXTRA_PORTS)
        self.port, self.ui_port, self.worker_ui_port = ports[:3]
        self.extra_ports = ports[3:]

    def _alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def up(self, timeout_s: float = 120.0, *, private: tuple[Path, ...] = ()) -> None:
        """Start the master and the worker; ``private`` folders are the worker's own (see
        :meth:`_start`: needs root and ``unshare``)."""
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        (self.home / "work").mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            if self._start_master(timeout_s):
                break
            if attempt == 2:
                tail = self.log_tail()
                self.down()
                raise AssertionError(f"the Spark master did not start, three times:\n{tail}")
            self._pick_ports()
        self._start_worker(timeout_s, private)

    def _start_master(self, timeout_s: float) -> bool:
        """Start the master and wait until it is ALIVE (True). A master that exits, or
        answers but stays in STANDBY (a port it binds after its web UI, such as the REST
        server's, was taken since it was picked: Spark logs the bind error and the master
        never takes the lead, so no worker can register), is stopped (False)."""
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        master = self.procs[-1]
        standby_since: float | None = None

        def settled() -> bool:
            nonlocal standby_since
            if master.poll() is not None:
                return True
            status = self._master_status()
            if status == "ALIVE":
                return True
            if status is not None and standby_since is None:
                standby_since = time.monotonic()
            return standby_since is not None and time.monotonic() - standby_since > 15.0

        wait_for(settled, "the master to answer", timeout=timeout_s)
        if master.poll() is None and self._master_status() == "ALIVE":
            return True
        self.procs.remove(master)
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGKILL)
            master.wait(timeout=30)
        return False

    def share_again(self, folder: Path) -> None:
        """Remove the worker's private mount over ``folder``: from now on it (and every
        executor it starts) sees the same folder as everyone else."""
        worker = self.procs[-1]
        subprocess.run(["nsenter", "-t", str(worker.pid), "-m", "umount", str(folder)], check=True)

    def restart_worker(self, timeout_s: float = 120.0, *, private: tuple[Path, ...] = ()) -> None:
        """Stop the worker (and its executors) and start a new one, sharing every folder
        unless ``private`` says otherwise."""
        worker = self.procs.pop()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        wait_for(lambda: self._alive_workers() == 0, "the old worker to leave the master", timeout=timeout_s)
        self.worker_ui_port = free_port()
        self._start_worker(timeout_s, private)

    def _start_worker(self, timeout_s: float, private: tuple[Path, ...]) -> None:
        """Start the worker and wait until the master lists it ALIVE. A worker that exits
        first, or is not listed in ``timeout_s``, is stopped and started once more (new UI
        port); a second failure stops the cluster and fails with both logs' tails."""
        for attempt in (1, 2):
            self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(self.worker_ui_port),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.home / "work"),
                self.master_url,
                private=private,
            )
            worker = self.procs[-1]
            registered = poll_until(
                lambda: self._alive_workers() == 1 or worker.poll() is not None,  # noqa: B023
                timeout_s,
            )
            if registered and worker.poll() is None:
                return
            self.procs.remove(worker)
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=30)
            if attempt == 2:
                tail = self.log_tail()
                self.down()
                raise AssertionError(
                    f"the Spark worker did not register with the master in {timeout_s:.0f} s "
                    f"(exit code {worker.returncode}), twice:\n{tail}"
                )
            self.worker_ui_port = free_port()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for name in ("master", "worker"):
            path = self.home / f"{name}.log"
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def executor_logs(self) -> str:
        """Every executor's stderr (under the worker's work dir)."""
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.home / "work").rglob("stderr")))

    def down(self) -> None:
        """Stop the worker (and its executors) and the master; nothing is left running."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        procs = list(self.procs)
        wait_for(lambda: not any(pid_alive(p.pid) for p in procs), "the cluster to stop", timeout=30)
        self.procs.clear()
