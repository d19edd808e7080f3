"""Helpers for the fault tests of the commit protocol: committer children stopped at a
named step, broker signals, requests observed in flight, and the group-offset check
every fault test ends with.

Everything here observes real processes (``/proc``), never mocks them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from eo_harness import EO, Child, Harness, poll_until, process_state, wait_for

from airflow_provider_eo import names
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import high_watermarks
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import LocalKafka, pid_alive, port_in_use


# -- committer children --------------------------------------------------------------------
def spawn_commit(h: Harness, *, fault: str | None = None, action: str = "pause", hit: int = 1) -> Child:
    """Start ``eo commit`` for the harness's pipeline in a child process; with ``fault``, it
    stops (``action``) the ``hit``-th time it reaches that step."""
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    for key in ("EO_FAULT", "EO_FAULT_ACTION", "EO_FAULT_HIT"):
        env.pop(key, None)
    if fault:
        env.update(EO_FAULT=fault, EO_FAULT_ACTION=action, EO_FAULT_HIT=str(hit))
    # Files, not pipes: a chatty child must never block on a full pipe.
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed by the OS)
    cmd = [EO, "commit", "eo_test_pipelines:from_env", "--json"]
    return Child(subprocess.Popen(cmd, env=env, stdout=out, stderr=err), out, err)


def paused_commit(h: Harness, step: str, *, hit: int = 1) -> Child:
    """An ``eo commit`` child stopped (SIGSTOP by itself) the ``hit``-th time at ``step``."""
    child = spawn_commit(h, fault=step, action="pause", hit=hit)
    wait_for(lambda: process_state(child.pid) == "T", f"the committer to pause at {step}", child=child)
    return child


def finish(child: Child, timeout: float = 240.0) -> tuple[int, str, str]:
    """Wait for a child; return (returncode, stdout, stderr)."""
    out, err = child.communicate(timeout=timeout)
    assert child.returncode is not None
    return child.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def zombie_pid(
    flag: Path,
    *,
    timeout: float = 300.0,
    child: Child | None = None,
    gone: Callable[[], str | None] | None = None,
) -> int:
    """The pid of the Spark commit task that stopped itself inside its open transaction
    (``EO_FAULT_ACTION=zombie`` with ``EO_FAULT_ONCE=flag``: it writes ``<flag>.pid``).
    Fails early when ``child`` exits, or when ``gone`` returns why the run ended."""
    pid_file = Path(f"{flag}.pid")

    def stopped() -> bool:
        reason = gone() if gone is not None else None
        if reason:
            raise AssertionError(f"the run ended before a commit task stopped itself: {reason}")
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        return bool(text) and process_state(int(text)) == "T"

    wait_for(stopped, "a commit task to stop itself inside its transaction", timeout=timeout, child=child)
    return int(pid_file.read_text())


def resume_and_reap(pid: int, timeout: float = 60.0) -> None:
    """Let a stopped task go on (a later committer fenced it: it fails on its own), then make
    sure it is gone."""
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        poll_until(lambda: process_state(pid) in ("", "Z"), timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_child(child: Child) -> None:
    """SIGKILL a child that is still running (test clean-up), and reap it."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait(timeout=30)


# -- librdkafka threads and sockets of a process ---------------------------------------------
def rdkafka_threads(pid: int) -> set[int]:
    """Thread ids of ``pid`` that librdkafka started (named ``rdk:...``)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if task.joinpath("comm").read_text().startswith("rdk:"):
                out.add(int(task.name))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_rows() -> list[tuple[int, int, int, int]]:
    """(local port, remote port, rx_queue bytes, inode) of every TCP socket (the JVM's
    sockets are IPv6 ones, even on 127.0.0.1)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            local_port = int(f[1].rsplit(":", 1)[1], 16)
            remote_port = int(f[2].rsplit(":", 1)[1], 16)
            rx_queue = int(f[4].split(":")[1], 16)
            rows.append((local_port, remote_port, rx_queue, int(f[9])))
    return rows


def bytes_in_flight_to(broker_port: int, pid: int) -> int:
    """Bytes that process ``pid`` sent to the broker on ``broker_port`` and the broker has
    not read yet: requests in flight to a stopped broker sit in its sockets' receive queue."""
    mine = _socket_inodes(pid)
    rows = _tcp_rows()
    client_ports = {lp for lp, rp, _rx, inode in rows if inode in mine and rp == broker_port}
    return sum(rx for lp, rp, rx, _inode in rows if lp == broker_port and rp in client_ports)


# -- the broker ----------------------------------------------------------------------------
def broker_pid(kafka: LocalKafka) -> int:
    """The pid of the running broker started from ``kafka``'s folder."""
    info = kafka.info()
    assert info is not None, "the broker is not running"
    return info.pid


#: Settings for a broker a test kills and starts again (and never stops with SIGSTOP: resumed
#: after more than the session time-out, it would fence itself first). A killed broker
#: re-registers only once the controller has fenced its previous incarnation, after
#: broker.session.timeout.ms (9 s by default: a restart took 12.7 s, with these 6 s).
QUICK_RESTART_CONFIG = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


def crash_restart(kafka: LocalKafka) -> None:
    """SIGKILL the broker (stopped or not: whatever it had not read is lost unanswered) and
    start it again on the same port, from the same data."""
    info = kafka.info()
    assert info is not None
    os.killpg(info.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(info.pid), "the broker to die", timeout=30)
    # Clients reconnecting every few ms to a port nobody listens on can briefly hold it
    # (a loopback self-connect): wait until it is free again.
    wait_for(lambda: not port_in_use(info.port), f"port {info.port} to be free", timeout=60)
    assert kafka.up(timeout_s=120).port == info.port


# -- Kafka-side views ----------------------------------------------------------------------
def sink_tps(pipeline: Pipeline) -> list[tuple[str, int]]:
    """Every partition of the pipeline's sink topic."""
    config = librdkafka_config(pipeline.kafka)
    parts = admin.partitions_of(config, [pipeline.sink_topic])[pipeline.sink_topic]
    return [(pipeline.sink_topic, p) for p in parts]


def stable_and_high(pipeline: Pipeline) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(last stable offsets, high watermarks) of the sink: they differ while a transaction
    is open."""
    config = librdkafka_config(pipeline.kafka)
    tps = sink_tps(pipeline)
    return admin.list_offsets(config, tps, spec="latest"), high_watermarks(config, tps)


def marker(pipeline: Pipeline, shard: int) -> int:
    """The checkpoint id shard ``shard``'s commit marker shows (-1: none)."""
    config = librdkafka_config(pipeline.kafka)
    found = admin.committed_group_offsets(
        config, names.marker_group(pipeline), [(pipeline.sink_topic, shard)]
    )
    return found.get((pipeline.sink_topic, shard), -1)


def group_offsets(pipeline: Pipeline, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The pipeline group's committed (stable, read_committed) offsets."""
    return admin.committed_group_offsets(librdkafka_config(pipeline.kafka), pipeline.group_id, partitions)


def assert_group_offsets_match_ledger(pipeline: Pipeline, ledger: Ledger) -> None:
    """The pipeline's consumer-group offsets equal the end offsets of its COMMITTED
    checkpoints (the latest end per partition): what lag monitoring and a ``group``
    startup read must agree with the ledger after any fault."""
    expected: dict[tuple[str, int], int] = {}
    partitions: set[tuple[str, int]] = set()
    for cp in sorted(ledger.list_checkpoints(pipeline.name), key=lambda c: c.checkpoint_id):
        for r in cp.ranges:
            partitions.add((r.topic, r.partition))
            if cp.state is CheckpointState.COMMITTED:
                expected[(r.topic, r.partition)] = r.end
    assert expected, f"pipeline {pipeline.name!r} has no COMMITTED checkpoint"
    # Every partition the ledger ever planned: none may carry an offset no commit made.
    found = group_offsets(pipeline, sorted(partitions))
    assert found == expected, f"group {pipeline.group_id!r} offsets {found} != ledger ends {expected}"


def new_pipeline_name(prefix: str) -> str:
    """A unique pipeline name (transactional ids and marker groups derive from it)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def sigcont(pid: int) -> None:
    """Resume a stopped process (no error when it is gone)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def any_process_state(pid: int) -> str:
    """Like :func:`process_state`, but 'X' for a process that no longer exists."""
    try:
        return process_state(pid)
    except (FileNotFoundError, ProcessLookupError):
        return "X"
