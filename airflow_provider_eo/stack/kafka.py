"""A real single-node Apache Kafka broker (KRaft, transactions on) on 127.0.0.1.

Started from Maven Central jars by ``eo dev up``, the demo and the test fixtures; the
state (config, data, logs, pid, ports) lives under ``<state_dir>/kafka``. Its client
listener is PLAINTEXT, or SASL_SSL with SCRAM users (:class:`ListenerSecurity`).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_eo.processes import pid_alive
from airflow_provider_eo.stack.errors import StackError
from airflow_provider_eo.stack.maven import kafka_broker_jars
from airflow_provider_eo.stack.paths import state_dir

KAFKA_VERSION = "4.1.1"
LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now: all are
    held open at once while they are picked (one :func:`free_port` after another may return
    the same port twice: a 3-node test cluster once got one port for a node's client and
    controller listeners, and Kafka refused to format its storage)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_in_use(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def new_cluster_id(random_bytes: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id (base64 of 16 random bytes) that does not start with ``-``: the
    storage tool would read ``-t -…`` as a missing argument (1 in 64 random ids)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(random_bytes()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ListenerSecurity:
    """A SASL_SSL client listener with SCRAM users (the broker's own inter-broker traffic
    uses it too, as the first user).

    :param key_store: PEM file with the broker's private key (PKCS#8, unencrypted) and its
        certificate chain; the certificate must name 127.0.0.1 (clients verify it).
    :param ca: PEM file of the CA that signed it.
    :param users: SCRAM users (name -> password) created when the storage is formatted;
        the first one is the broker's own.
    :param mechanism: ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``.
    """

    key_store: Path
    ca: Path
    users: Mapping[str, str]
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        if self.mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"mechanism must be one of {SCRAM_MECHANISMS}, not {self.mechanism!r}")
        if not self.users:
            raise ValueError("a SASL_SSL listener needs at least one SCRAM user (the broker's own)")
        for name, password in self.users.items():
            # The storage tool's --add-scram syntax has no quoting for these.
            if not name or any(c in f"{name}{password}" for c in '[],="'):
                raise ValueError(f'SCRAM user {name!r}: names and passwords may not contain [ ] , = "')

    @property
    def broker_user(self) -> tuple[str, str]:
        """The user the broker logs in as to itself."""
        return next(iter(self.users.items()))

    def broker_config(self) -> dict[str, str]:
        """``server.properties`` settings of the SASL_SSL listener (named ``SASL_SSL``)."""
        user, password = self.broker_user
        login = "org.apache.kafka.common.security.scram.ScramLoginModule"
        return {
            "sasl.enabled.mechanisms": self.mechanism,
            "sasl.mechanism.inter.broker.protocol": self.mechanism,
            f"listener.name.sasl_ssl.{self.mechanism.lower()}.sasl.jaas.config": (
                f'{login} required username="{user}" password="{password}";'
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.key_store),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.endpoint.identification.algorithm": "https",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM users."""
        args: list[str] = []
        for name, password in self.users.items():
            args += ["--add-scram", f"{self.mechanism}=[name={name},password={password}]"]
        return args

    def client_config(self, bootstrap: str) -> dict[str, str]:
        """librdkafka settings of the broker's own user for ``bootstrap``."""
        user, password = self.broker_user
        return {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca),
        }


@dataclass(frozen=True)
class BrokerInfo:
    """What ``up`` started: enough for ``down`` to stop exactly that process."""

    pid: int
    port: int
    controller_port: int
    version: str

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"


#: The broker JVM's heap, as Kafka's start scripts set it unless ``KAFKA_HEAP_OPTS`` does.
DEFAULT_HEAP_OPTS = "-Xms256m -Xmx1g"
#: The broker JVM's collector and JIT unless ``KAFKA_JVM_PERFORMANCE_OPTS`` says otherwise.
DEFAULT_PERFORMANCE_OPTS = "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true"


def broker_jvm_opts() -> list[str]:
    """The local broker's JVM options: ``KAFKA_HEAP_OPTS`` and ``KAFKA_JVM_PERFORMANCE_OPTS``
    replace the defaults, as they do for Kafka's own ``kafka-server-start.sh`` (a broker
    that lives a minute starts faster on the client JIT and the serial collector:
    ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``)."""
    heap = os.environ.get("KAFKA_HEAP_OPTS") or DEFAULT_HEAP_OPTS
    perf = os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS") or DEFAULT_PERFORMANCE_OPTS
    return [*shlex.split(heap), *shlex.split(perf)]


class LocalKafka:
    """Start, find and stop the local broker.

    :param home: state folder for this broker (default ``<state_dir>/kafka``).
    :param port: client port; ``None`` picks a free one on first start and keeps it.
    :param version: Apache Kafka version fetched from Maven Central.
    :param extra_config: broker settings added to (or overriding) ``server.properties``,
        e.g. ``{"offsets.retention.minutes": "1"}`` for a test of expiring group offsets.
    :param cluster_id: KRaft cluster id used when formatting the storage (default: a new
        one); the nodes of one multi-node cluster must share it.
    :param security: a SASL_SSL client listener with SCRAM users instead of PLAINTEXT.
    """

    def __init__(
        self,
        *,
        home: Path | None = None,
        port: int | None = None,
        version: str = KAFKA_VERSION,
        extra_config: Mapping[str, str] | None = None,
        cluster_id: str | None = None,
        security: ListenerSecurity | None = None,
    ) -> None:
        self.home = home or state_dir() / "kafka"
        self.requested_port = port
        self.version = version
        self.extra_config = dict(extra_config or {})
        self.cluster_id = cluster_id
        self.security = security

    # -- state files -----------------------------------------------------------------
    @property
    def _info_file(self) -> Path:
        return self.home / "broker.json"

    def info(self) -> BrokerInfo | None:
        """The running broker this folder started, or ``None``."""
        try:
            raw = json.loads(self._info_file.read_text())
        except (OSError, ValueError):
            return None
        info = BrokerInfo(**raw)
        return info if pid_alive(info.pid) else None

    def _ports(self) -> tuple[int, int]:
        ports_file = self.home / "ports.json"
        if self.requested_port is not None:
            port = self.requested_port
            controller = free_port()
        elif ports_file.is_file():
            saved = json.loads(ports_file.read_text())
            port, controller = int(saved["port"]), int(saved["controller_port"])
            if port_in_use(port) or port_in_use(controller):
                port, controller = free_port(), free_port()
        else:
            port, controller = free_port(), free_port()
        while controller == port:
            controller = free_port()
        for p, what in ((port, "client"), (controller, "controller")):
            if port_in_use(p):
                raise StackError(
                    f"port {p} on 127.0.0.1 (Kafka {what} listener) is already in use by another "
                    f"process; stop it or choose another port with `eo dev up --port N`."
                )
        ports_file.write_text(json.dumps({"port": port, "controller_port": controller}))
        return port, controller

    def client_config(self, info: BrokerInfo) -> dict[str, str]:
        """librdkafka settings that reach the running broker (its own SCRAM user on a
        SASL_SSL listener)."""
        if self.security is not None:
            return self.security.client_config(info.bootstrap)
        return {"bootstrap.servers": info.bootstrap}

    def _listener_config(self, port: int, controller: int) -> dict[str, str]:
        name = "PLAINTEXT" if self.security is None else "SASL_SSL"
        props = {
            "listeners": f"{name}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"{name}://127.0.0.1:{port}",
            "inter.broker.listener.name": name,
            "listener.security.protocol.map": f"{name}:{name},CONTROLLER:PLAINTEXT",
        }
        if self.security is not None:
            props.update(self.security.broker_config())
        return props

    def _write_config(self, port: int, controller: int) -> Path:
        data = self.home / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            **self._listener_config(port, controller),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(data),
            "num.partitions": "1",
            # A single node: the internal topics cannot have more than one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Consumers join at once instead of waiting 3 s for more members.
            "group.initial.rebalance.delay.ms": "0",
            # A missing topic must be an error the pipeline reports, not created silently.
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            **self.extra_config,
        }
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    # -- lifecycle -------------------------------------------------------------------
    def up(self, *, timeout_s: float = 90.0) -> BrokerInfo:
        """Start the broker unless it already runs; wait until it answers. Idempotent."""
        self.home.mkdir(parents=True, exist_ok=True)
        running = self.info()
        if running is not None:
            self.wait_ready(running, timeout_s=timeout_s)
            return running
        java = shutil.which("java")
        if java is None:
            raise StackError(
                "`java` was not found on PATH; the local Kafka broker needs Java 17+ "
                "(Debian: apt-get install -y openjdk-17-jre-headless)."
            )
        jars = kafka_broker_jars(self.version)
        classpath = os.pathsep.join(str(j) for j in jars)
        port, controller = self._ports()
        config = self._write_config(port, controller)
        logs = self.home / "logs"
        logs.mkdir(exist_ok=True)
        jvm = [
            java,
            *broker_jvm_opts(),
            f"-Dkafka.logs.dir={logs}",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            classpath,
        ]
        if not (self.home / "data" / "meta.properties").is_file():
            cluster_id = self.cluster_id or new_cluster_id()
            scram = self.security.format_args() if self.security is not None else []
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), *scram],
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise StackError(
                    f"formatting Kafka storage under {self.home / 'data'} failed "
                    f"(exit {fmt.returncode}); delete that folder and retry.\n"
                    f"{fmt.stdout}{fmt.stderr}"
                )
        out = (logs / "stdout.log").open("ab")
        proc = subprocess.Popen(
            [*jvm, "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI; `down` signals exactly this pid
        )
        out.close()
        info = BrokerInfo(pid=proc.pid, port=port, controller_port=controller, version=self.version)
        self._info_file.write_text(json.dumps(info.__dict__))
        try:
            self.wait_ready(info, timeout_s=timeout_s, proc=proc)
        except StackError:
            self.down()
            raise
        return info

    def wait_ready(
        self, info: BrokerInfo, *, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        """Poll until the broker lists its metadata, or fail with the log's tail."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        admin = AdminClient({**self.client_config(info), "log_level": 0})
        last_error = "no answer"
        while time.monotonic() < deadline:
            if (proc is not None and proc.poll() is not None) or not pid_alive(info.pid):
                raise StackError(
                    f"the Kafka broker (pid {info.pid}) exited during start-up; see "
                    f"{self.home / 'logs'}:\n{self._log_tail()}"
                )
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception as exc:  # KafkaException while the listener is not up yet
                last_error = str(exc)
            time.sleep(0.3)
        raise StackError(
            f"the Kafka broker on {info.bootstrap} did not answer within {timeout_s:.0f}s "
            f"({last_error}); see {self.home / 'logs'}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        chunks = []
        for name in ("stdout.log", "server.log"):
            path = self.home / "logs" / name
            if path.is_file():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(chunks)

    def down(self, *, timeout_s: float = 30.0) -> bool:
        """Stop the broker this folder started (SIGTERM, then SIGKILL). False if none ran."""
        info = self.info()
        self._info_file.unlink(missing_ok=True)
        if info is None:
            return False
        try:
            os.killpg(info.pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and pid_alive(info.pid):
            time.sleep(0.2)
        if pid_alive(info.pid):
            with_kill = True
            try:
                os.killpg(info.pid, signal.SIGKILL)
            except ProcessLookupError:
                with_kill = False
            if with_kill:
                print(f"eo: broker pid {info.pid} ignored SIGTERM; killed", file=sys.stderr)
        return True

    def wipe(self) -> None:
        """Stop the broker and delete its data (keeps the cached jars)."""
        self.down()
        shutil.rmtree(self.home, ignore_errors=True)
