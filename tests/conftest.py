"""Shared fixtures: one real Kafka broker and one Spark session per test run, PostgreSQL, and
the ledger factory (``make_ledger``) every test that needs a ledger uses."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

ROOT = Path(__file__).resolve().parents[1]
PG_SCRIPT = ROOT / "scripts" / "postgres.sh"
TESTS = Path(__file__).resolve().parent
# Test transforms/pipelines must be importable by Spark's Python workers and by `eo`
# subprocesses, not only by this interpreter.
sys.path.insert(0, str(TESTS))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from eo_jvm_archive import SHORT_LIVED_JVM, spark_submit_opts  # noqa: E402  (found through the path above)

# Sensors wait in the triggerer unless a test says otherwise (Airflow's default is to poke).
os.environ.setdefault("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
# Every Spark driver a test starts (a cluster master too) binds and advertises loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every Spark driver JVM a test starts (this session's, spark-submit's, an `eo` child's) runs
# a few short jobs on a small, shared machine: the client JIT only (their cluster executors
# too), and pyspark's classes
# mapped from a class-data-sharing archive when `tests/eo_jvm_archive.py` made one (the full
# run makes it first). Set SPARK_SUBMIT_OPTS to override.
os.environ.setdefault("SPARK_SUBMIT_OPTS", spark_submit_opts())
# Every broker a test starts lives minutes, not months: the client JIT and the serial
# collector start it in two thirds of the CPU (Kafka's own variable; see stack/kafka.py).
os.environ.setdefault("KAFKA_JVM_PERFORMANCE_OPTS", f"{SHORT_LIVED_JVM} -Djava.awt.headless=true")


#: The longest files first (run with ``--no-loadscope-reorder``, pytest-xdist hands out files
#: in this order): a file on a YARN cluster, then Airflow's, then Spark's, then the broker's,
#: and the unit tests last, so the run does not end waiting on one long file started late.
_HEAVY_FIRST = ("hadoop", "airflow", "spark", "kafka", "postgres")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests by :data:`_HEAVY_FIRST` (stable: a file's tests keep their order)."""

    def weight(item: pytest.Item) -> int:
        names = {m.name for m in item.iter_markers()}
        return next((i for i, name in enumerate(_HEAVY_FIRST) if name in names), len(_HEAVY_FIRST))

    items.sort(key=weight)


def _machine_cpu() -> tuple[float, float]:
    """(busy, idle) core-seconds of the whole machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / hz, idle / hz


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``EO_TEST_TIMELINE`` set (``make test`` sets it), append each test's timeline to
    that file: when it ran, in which worker, the CPU its process and reaped children used, and
    how busy the whole machine was meanwhile (``scripts/test_times.py --timeline`` sums them
    per file: a file that leaves the cores idle waits on something)."""
    path = os.environ.get("EO_TEST_TIMELINE")
    if not path:
        yield
        return
    start, (busy0, idle0), own0 = time.time(), _machine_cpu(), os.times()
    yield
    end, (busy1, idle1), own1 = time.time(), _machine_cpu(), os.times()
    own = (own1.user + own1.system + own1.children_user + own1.children_system) - (
        own0.user + own0.system + own0.children_user + own0.children_system
    )
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": round(start, 3),
        "end": round(end, 3),
        "own_cpu": round(own, 2),
        "machine_busy": round(busy1 - busy0, 2),
        "machine_idle": round(idle1 - idle0, 2),
    }
    with contextlib.suppress(OSError), open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """A test whose worker died (a native abort, or its timeout) is reported failed once.

    pytest-xdist's ``loadfile`` scheduler puts the dead worker's file back in its queue with
    that test still pending, so the replacement worker would run it again (and die again),
    and after a few deaths the controller waits for work nobody is given until CI's limit.
    Marking the test done lets the replacement worker run only the file's remaining tests.
    """
    scope = crashitem.rsplit("::", 1)[0]
    unit = getattr(sched, "workqueue", {}).get(scope)
    if unit is None or crashitem not in unit:
        return
    unit[crashitem] = True
    if all(unit.values()):
        del sched.workqueue[scope]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka broker (KRaft, transactions on) for the whole session, stopped at the end.

    It uses its own state folder so it never touches a developer's `eo dev up` broker.
    """
    from airflow_provider_eo.stack.kafka import LocalKafka, pid_alive

    external = os.environ.get("EO_TEST_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    # One folder per test session: concurrent sessions (a developer's and an agent's,
    # or two CI shards) must never stop each other's broker. Folders of sessions that
    # died are cleaned here.
    parent = ROOT / ".eo" / "test-kafka"
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.iterdir():
        owner = int(old.name) if old.name.isdigit() else -1
        if old.is_dir() and not (owner > 0 and pid_alive(owner)):  # its session is gone: stop and delete
            LocalKafka(home=old).wipe()
    # A transaction past its timeout is aborted within half a second (the broker looks every
    # 10 s by default): a test waiting for the broker's abort does not wait up to 10 s more,
    # and a commit too large for its timeout always fails.
    kafka = LocalKafka(
        home=parent / str(os.getpid()),
        extra_config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"},
    )
    kafka.wipe()  # a fresh log every session: tests count records exactly
    info = kafka.up(timeout_s=120)
    try:
        yield info.bootstrap
    finally:
        # Close the shared clients while the broker still answers: left to the exit,
        # each one waits on its dead connections (the session hung for minutes).
        from airflow_provider_eo.kafka.admin import close_shared_clients
        from airflow_provider_eo.kafka.publisher import close_producers

        close_shared_clients()
        close_producers()  # the idle transactional producers local commits kept
        kafka.wipe()


@pytest.fixture(scope="session")
def kafka_config(kafka_bootstrap: str) -> dict[str, Any]:
    """librdkafka-style client config for the session broker."""
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture()
def make_topic(kafka_config: dict[str, Any]) -> Callable[..., str]:
    """Create a uniquely named topic; returns its name."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    def _make(prefix: str = "t", partitions: int = 1, **topic_config: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topic(kafka_config, name, partitions=partitions, topic_config=topic_config)
        return name

    return _make


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession with the Kafka connector, shared by the session's tests."""
    from airflow_provider_eo.spark.session import get_spark

    session = get_spark("eo-tests")
    try:
        yield session
    finally:
        session.stop()


# -- PostgreSQL (scripts/postgres.sh), for ledgers on a real database -------------------------
def _parse_env_lines(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


# Test sessions using the server (one file per session, named by its pid) and whether a test
# session started it: concurrent sessions (pytest-xdist workers, two developers' runs) share
# one server, and the last one to finish stops it when a test session started it.
PG_USERS = ROOT / ".eo" / "test-postgres-users"
PG_STARTED_BY_TESTS = PG_USERS / "started-by-tests"


@contextlib.contextmanager
def _pg_users_lock() -> Iterator[None]:
    """Held while a session starts, joins, leaves or stops the shared server."""
    PG_USERS.mkdir(parents=True, exist_ok=True)
    with open(PG_USERS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _other_pg_users() -> list[int]:
    """Pids of the other live sessions registered in PG_USERS (files of dead ones are removed)."""
    from airflow_provider_eo.processes import pid_alive

    live = []
    for entry in PG_USERS.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        if pid_alive(int(entry.name)):
            live.append(int(entry.name))
        else:
            entry.unlink(missing_ok=True)
    return live


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the maintenance database of the local PostgreSQL; stopped at the end when a test
    session started it and no other test session still uses it."""
    with _pg_users_lock():
        proc = subprocess.run(["bash", str(PG_SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            message = (
                f"could not start PostgreSQL with {PG_SCRIPT} start (exit {proc.returncode}):\n"
                f"{proc.stderr[-3000:]}"
            )
            pytest.fail(message)
        info = _parse_env_lines(proc.stdout)
        if info.get("EO_PG_STARTED") == "1":
            PG_STARTED_BY_TESTS.touch()
        elif not _other_pg_users():  # running, and not for a live test session: someone else's
            PG_STARTED_BY_TESTS.unlink(missing_ok=True)
        (PG_USERS / str(os.getpid())).touch()
    try:
        yield info["EO_PG_URL"]
    finally:
        with _pg_users_lock():
            (PG_USERS / str(os.getpid())).unlink(missing_ok=True)
            if not _other_pg_users() and PG_STARTED_BY_TESTS.exists():
                subprocess.run(["bash", str(PG_SCRIPT), "stop"], capture_output=True, timeout=120)
                PG_STARTED_BY_TESTS.unlink(missing_ok=True)


# -- Ledgers: one factory (tests/eo_ledgers.py) for every test that needs one ------------------
@pytest.fixture(scope="session")
def ledger_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite ledger file migrated once per session; every SQLite ledger is a copy of it."""
    from eo_ledgers import migrated_template

    return migrated_template(tmp_path_factory.mktemp("template") / "ledger.db")


@pytest.fixture()
def make_ledger(
    request: pytest.FixtureRequest, tmp_path: Path, ledger_template: Path
) -> Iterator[LedgerFactory]:
    """Fresh ledgers for this test: ``make_ledger(kind="sqlite"|"postgres", pipeline=...)``
    opens one, ``make_ledger.url(kind, migrated=...)`` makes a database and returns its URL;
    all closed and dropped after the test (:class:`eo_ledgers.LedgerFactory`)."""
    from eo_ledgers import LedgerFactory

    factory = LedgerFactory(request, tmp_path, ledger_template)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture()
def pg_fresh_url(make_ledger: LedgerFactory) -> str:
    """A PostgreSQL database of this test's own without the ledger schema, dropped after it."""
    return make_ledger.url("postgres", migrated=False)


@pytest.fixture(autouse=True, scope="module")
def _close_shared_kafka_clients() -> Iterator[None]:
    """Each test module's shared Kafka clients and idle producers are closed after it: a
    worker runs hundreds of pipelines (a group consumer each), and a process with over
    1,024 open files breaks py4j's callback server (a later streaming query hangs)."""
    yield
    admin = sys.modules.get("airflow_provider_eo.kafka.admin")
    publisher = sys.modules.get("airflow_provider_eo.kafka.publisher")
    if admin is not None:
        admin.close_shared_clients()
    if publisher is not None:
        publisher.close_producers()


@pytest.fixture(autouse=True)
def _close_shared_ledger_readers() -> Iterator[None]:
    """The triggers' per-process ledger readers hold pooled connections: closed after each
    test, before its ledger database is dropped."""
    yield
    module = sys.modules.get("airflow_provider_eo.triggers.checkpoint")
    if module is not None:
        module.close_ledger_readers()
