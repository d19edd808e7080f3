"""A StatsD listener for tests: a UDP socket on 127.0.0.1 and a thread collecting what it
receives, parsed into :class:`Metric` lines (plain, InfluxDB-tagged and Datadog-tagged)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Metric:
    """One StatsD line: ``name[,k=v...]:value|type[|@rate][|#k:v,...]``."""

    name: str
    value: float
    kind: str  # c, ms, g
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, line: str) -> Metric:
        head, _, rest = line.partition(":")
        parts = rest.split("|")
        value, kind = parts[0], parts[1]
        name, *influx = head.split(",")
        tags = dict(t.split("=", 1) for t in influx)
        for extra in parts[2:]:
            if extra.startswith("#"):  # Datadog: |#k:v,k2:v2
                tags.update(t.split(":", 1) for t in extra[1:].split(","))
        return cls(name, float(value), kind, tags)


class StatsdListener:
    """Collects StatsD datagrams sent to ``port`` on 127.0.0.1 until :meth:`stop`."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statsd-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.lines.extend(ln for ln in data.decode(errors="replace").splitlines() if ln)

    def metrics(self, prefix: str = "") -> list[Metric]:
        """What arrived so far whose name starts with ``prefix``."""
        with self._lock:
            lines = list(self.lines)
        parsed = [Metric.parse(ln) for ln in lines]
        return [m for m in parsed if m.name.startswith(prefix)]

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        self.sock.close()


def statsd_env(port: int, *, tags: str = "influxdb") -> dict[str, str]:
    """Airflow's ``[metrics]`` as environment variables: StatsD to ``port`` on 127.0.0.1 with
    the prefix ``airflow``, tags in the ``tags`` mode (``influxdb``, ``datadog`` or ``none``)."""
    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    if tags == "influxdb":
        env["AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED"] = "True"
    elif tags == "datadog":
        env["AIRFLOW__METRICS__STATSD_DATADOG_ENABLED"] = "True"
    return env


@contextmanager
def statsd_listener() -> Iterator[StatsdListener]:
    """A running :class:`StatsdListener`, stopped on exit."""
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.stop()
