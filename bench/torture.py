"""Torture run: `eo run-once` in a loop under a seeded chaos driver, then catch-up and audit.

Usage: .venv/bin/python bench/torture.py --cycles N --seed S [--prepare child|mixed]
       [--rate R] [--max-records M] [--kinds k1,k2]

The short seeded run (every fault kind once and a spare cycle; about 100 s on 2 cores with
the first 9 kinds and 10 cycles): ``bench/torture.py --cycles 15 --seed 11 --max-records
5000 --rate 15`` (large checkpoints and a slow feeder keep the catch-up to a few runs).

A broker of its own (4+ source, 3+ sink partitions; ``max.message.bytes`` 64 KiB on the sink,
256 KiB on the source; a dead-letter topic of 2 partitions) and a PostgreSQL ledger
(``scripts/postgres.sh`` cluster ``torture``, one database per run). The transform copies
each record and fails on a value starting with ``POISON`` (``poison_prefix``, no Python UDF),
which becomes a dead letter (up to 3 per checkpoint). A feeder process produces input
continuously: keyed and null-keyed records, some in committed and some in aborted
transactions, some a little under the sink's ``max.message.bytes``. The bench's own Kafka
clients never outlive a broker restart: the feeder process is re-created after each one (and
started again if it died), this process's admin clients and readers are closed before the
broker stops and made afresh after. A crash of the bench's own clients (a feeder process
that died) is logged and counted as ``bench_crashes``, never as a violation: the audits
read the source itself. Each cycle the driver
picks (seeded) one fault kind and runs one ``eo run-once`` child while injecting it:

- ``none``            a clean run-once;
- ``kill_prepare``    SIGKILL while the child prepares (``EO_FAULT=prepare.*`` or a random
                      moment after it planned);
- ``kill_commit``     SIGKILL at a random commit step (``EO_FAULT=commit.*``);
- ``stop_commit``     SIGSTOP the committer with its transaction open, past the transaction
                      timeout (until the broker has aborted it), then SIGCONT or SIGKILL;
- ``restart_broker``  stop the broker (SIGTERM or SIGKILL) while the child runs, start it
                      again on the same port and data;
- ``stop_postgres``   stop PostgreSQL (the ledger) while the child runs, then start it;
- ``abort_race``      ``eo abort`` (or ``eo recover``) from another process while the child
                      commits checkpoint N, aimed at N or at N+1 (planned beside it:
                      ``max_pending=2``): with the committer paused holding its lease it must
                      be refused and change nothing; unpaused, at a random moment, it is
                      refused or aborts before anything is published;
- ``stale_ledger``    copy the ledger database, commit past the copy, put the old copy in
                      its place: the child must exit non-zero with "the ledger is older than
                      the sink" (LedgerBehindSink) and the sink's high watermarks must not
                      move; then the newest ledger goes back;
- ``hide_staging``    staging invisible to the driver: the PREPARED checkpoint's attempt,
                      checkpoint or whole staging folder moved away before the child commits
                      (must fail, checkpoint still PREPARED, sink unchanged; when every
                      shard was already COMMITTED it must finish publishing nothing), or (``--prepare
                      mixed``) the staged data moved away before the driver lists it (the
                      prepare must refuse with StagingError, checkpoint still PLANNED); then
                      it is made visible again and the next run finishes it;
- ``expire_markers_abort`` checkpoint N's committer killed inside shard 1's transaction after
                      shard 0 committed (``EO_FAULT=commit.before_commit_txn``,
                      ``EO_FAULT_HIT=2``), the commit markers expired (the marker group
                      deleted, as offset retention does), then ``eo abort N --force-live``:
                      shard 0's COMMITTED row is proof of publication, so the abort must be
                      refused ("published"), N still PREPARED, the sink unchanged; the next
                      run-once commits N and publishes nothing twice;
- ``hanging_txn``     the committer SIGSTOPped inside its transaction (``before_commit_txn`` or
                      ``before_end_txn``, in a random shard; its transaction timeout 300 s),
                      then SIGKILLed: its transaction hangs on the sink. ``eo recover
                      --force-live`` (plus ``--abort-hanging`` and an ``eo doctor`` that must
                      name the transactional id, when this eo has that flag) must end it: every
                      sink partition's last stable offset at its high watermark within 30 s
                      and before the transaction's own timeout, the marker group's offsets
                      readable stable, the checkpoint COMMITTED; the next run-once publishes
                      nothing twice;
- ``oversize_dead_letter`` the dead-letter topic's ``max.message.bytes`` lowered to 16 KiB
                      and one record injected whose dead letter is larger: a poison record of
                      17-32 KiB, or a record of 68-128 KiB (over the sink's limit, so the
                      whole source record is the dead letter). The prepare of the checkpoint
                      that reads it must refuse, naming the topic, partition, offset and the
                      16 KiB limit, the checkpoint still PLANNED (when it is prepared instead,
                      its commit is run once to record what it does); then the limit is
                      raised to 1 MiB and the next run-once must commit it, the record one
                      dead letter and not in the sink. A commit still failing then is let
                      through by raising the sink's limit for one run (a violation already).
- ``spark_lease_lapse`` ``eo commit --commit-mode spark`` of checkpoint N with its first shard's
                      Spark task held before its shard began (``EO_FAULT=commit.task_start``,
                      ``zombie``) and its driver then stopped (SIGSTOP) until the commit lease
                      lapses; then ``eo abort N`` (nothing published: it must abort) or another
                      committer (``eo run-once``: it must commit N) acts on the lapsed lease; the
                      driver is killed or resumed (its lease keeper finds the lease gone and
                      cancels its jobs: it must not exit 0) and the held task goes on, its
                      ``init_transactions`` after the other's fence: the sink must not move (the
                      abort's mark, or the commit's marker, stops it); the next run-once
                      publishes nothing twice;
- ``ss_new_location`` a Structured Streaming query through ``KafkaExactlyOnceSink`` (identity
                      over the same source into a sink topic of its own, availableNow runs in
                      this process, a SQLite ledger) runs from its checkpoint location, then
                      starts again from a NEW one: without ``allow_new_query`` it must be refused
                      (QueryIdentityMismatch), its sink unchanged, and the old location goes on;
                      with it, started from the earliest or latest offsets or from the old
                      query's ends, it is refused naming those ends (unless it started there)
                      and, started there at another new location, continues the pipeline. Its
                      sink must never hold a record twice; after the catch-up it is audited
                      against the source like the pipeline's (``ss_sink`` in the last line).

A check a fault kind makes on the spot that fails is a *violation* (it fails the run). A
failed run-once is simply retried by the next cycle (restart-from-checkpoint). Afterwards
the feeder stops, run-once repeats until the ledger has consumed every source partition to
its end, and the sink is audited two ways: by value, independently of eo (every committed
input record exactly once in the sink or on the dead-letter topic, aborted input never), and
by ``eo audit``'s source-based
auditor (every source record of every committed range in the sink by provenance, dropped
by the transform or a dead letter; every staged record once; nothing of an uncommitted
checkpoint). Group offsets must equal the last committed ends.

``--prepare mixed`` (default) prepares in this process's Spark session, except in
``kill_prepare`` cycles, so a cycle does not pay a JVM start; ``child`` lets every
run-once child prepare by itself (slower, the most literal form).

The last line is machine-readable:
``torture: seed=<n> cycles=<n> faults=<n> kinds=<k:n,...> in=<n> out=<n> dead_letters=<n> duplicates=<n>
missing=<n> by_value=dup:<n>,miss:<n> source_audit=records:<n>,dup:<n>,miss:<n>,unexpected:<n>,
dropped:<n>,dead_letters:<n> ss_sink=records:<n>,out:<n>,dup:<n>,miss:<n>,audit_ok:<bool>
group_offsets_ok=<bool> violations=<n> misrefused=<n> bench_crashes=<n>``
(``duplicates`` and ``missing`` are the larger of the two audits of the pipeline, plus the
Structured Streaming query's (``ss_sink``, ``none`` when ``ss_new_location`` never ran); ``misrefused`` counts
``stale_ledger`` runs refused safely, sink unchanged, but with another error than
LedgerBehindSink: not a failure of exactly-once). The exit status is 0 when the run is
exactly once (``Result.ok``) and, with at least one cycle per fault kind, every kind was
injected, the input held aborted transactions, as many records came out (published or
dead letters) as went in and
nothing was misrefused (``Result.gaps``, printed to stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
for _p in (str(TESTS), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from confluent_kafka import KafkaException, Producer  # noqa: E402

from airflow_provider_eo.kafka import admin  # noqa: E402
from airflow_provider_eo.kafka.audit import high_watermarks, read_sink, read_topic  # noqa: E402
from airflow_provider_eo.kafka.producer_pool import close_producers  # noqa: E402
from airflow_provider_eo.ledger import CheckpointState, Ledger  # noqa: E402
from airflow_provider_eo.pipeline import Pipeline  # noqa: E402
from airflow_provider_eo.stack.kafka import LocalKafka, pid_alive, port_in_use  # noqa: E402

KINDS = (
    "none",
    "kill_prepare",
    "kill_commit",
    "stop_commit",
    "restart_broker",
    "stop_postgres",
    "abort_race",
    "stale_ledger",
    "hide_staging",
    "expire_markers_abort",
    "hanging_txn",
    "oversize_dead_letter",
    "spark_lease_lapse",
    "ss_new_location",
)
# After every kind has been injected once, faults are drawn with these weights.
WEIGHTS = (2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
REF = "eo_test_pipelines:from_env"  # the child's pipeline: $EO_TEST_PIPELINE_JSON
PG_SCRIPT = ROOT / "scripts" / "postgres.sh"
EO = str(Path(sys.executable).with_name("eo"))
MAX_MESSAGE_BYTES = 64 * 1024  # the sink's max.message.bytes
# The source takes records larger than the sink does: such a record's output is refused by
# the sink, so it becomes a dead letter (the whole source record).
SOURCE_MAX_MESSAGE_BYTES = 256 * 1024
# The dead-letter topic's max.message.bytes while oversize_dead_letter injects (smaller than
# the sink's), and after its repair.
DLQ_MAX_MESSAGE_BYTES = 16 * 1024
DLQ_REPAIRED_BYTES = 1024 * 1024
# transaction_timeout_ms of hanging_txn's committer: long enough that only `eo recover`, not
# the broker's timeout, can end its transaction within the kind's check.
HANG_TIMEOUT_MS = 300_000
KILL_COMMIT_STEPS = (
    "commit.after_begin",
    "commit.before_commit_txn",
    "commit.after_commit_txn",
    "commit.before_ledger",
)
# The Structured Streaming side query of ss_new_location: its sink topic takes the largest
# source record, and a micro-batch reads at most this many records per trigger.
SS_SINK_MAX_MESSAGE_BYTES = 1024 * 1024
SS_MAX_OFFSETS = 2000


def _stderr(msg: str) -> None:
    print(f"[torture {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Result:
    """What a torture run found. ``ok`` is the exactly-once verdict."""

    seed: int
    cycles: int
    faults: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    missed: int = 0  # faults chosen but not reached (e.g. the child finished first)
    failed_runs: int = 0  # run-once children that did not exit 0
    records_in: int = 0  # committed source records (read_committed)
    aborted_in: int = 0  # source records of aborted transactions
    records_out: int = 0  # sink records (read_committed)
    dead_letters_out: int = 0  # dead-letter topic records (read_committed)
    duplicates: int = 0  # the larger of the two audits'
    missing: int = 0  # the larger of the two audits'
    value_duplicates: int = 0  # by value: sink + dead-letter records beyond the committed input's
    value_missing: int = 0  # by value: committed input records neither in the sink nor dead letters
    group_offsets_ok: bool = False
    audit: dict[str, Any] = field(default_factory=dict)  # the source-based audit (eo audit)
    # ss_new_location's Structured Streaming query, counted against the same source: records
    # (committed source records), out, dup, miss (by value), audit (its `eo audit` verdict);
    # empty when the kind never ran
    ss: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)  # checks made by a fault kind, failed
    # stale_ledger runs refused with another error than LedgerBehindSink (the sink unchanged)
    misrefused: list[str] = field(default_factory=list)
    # the bench's own clients that crashed (a feeder process): not a finding about eo
    bench_crashes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)

    @property
    def audit_ok(self) -> bool:
        """``eo audit`` passed, checked every committed input record (as many source records
        in the committed ranges as the source holds: nothing expired, nothing unplanned)."""
        a = self.audit
        return (
            bool(a.get("ok"))
            and a.get("source_expired", 0) == 0
            and a.get("source_records") == self.records_in
        )

    @property
    def ss_ok(self) -> bool:
        """The Structured Streaming query (when ss_new_location ran) published every committed
        source record exactly once by value, and its ``eo audit`` (every staged record of its
        batches once) passed."""
        s = self.ss
        if not s:
            return True
        return s.get("dup") == 0 and s.get("miss") == 0 and bool(s.get("audit_ok"))

    @property
    def ok(self) -> bool:
        """Nothing duplicated, nothing missing by either audit (nor by the Structured
        Streaming query's), group offsets at the committed ends, and no fault kind's own check
        failed."""
        return (
            self.duplicates == 0
            and self.missing == 0
            and self.audit_ok
            and self.ss_ok
            and self.group_offsets_ok
            and not self.violations
        )

    def gaps(self, kinds: Sequence[str]) -> list[str]:
        """What a run of at least one cycle per fault kind must also show beyond :attr:`ok`
        (empty when it does): every kind injected, input some of which came in aborted
        transactions, as many records out (published or dead letters) as in, no restored
        ledger misrefused."""
        found = [f"fault kind {k} never injected" for k in kinds if self.kinds.get(k, 0) < 1]
        if self.records_in == 0 or self.aborted_in == 0:
            found.append(f"input: {self.records_in} committed, {self.aborted_in} aborted (both must be > 0)")
        if self.records_out + self.dead_letters_out != self.records_in:
            found.append(
                f"{self.records_out} records out and {self.dead_letters_out} dead letters for "
                f"{self.records_in} in"
            )
        found += [f"misrefused: {m}" for m in self.misrefused]
        return found

    def line(self) -> str:
        """The machine-readable summary line."""
        kinds = ",".join(f"{k}:{self.kinds.get(k, 0)}" for k in KINDS)
        a = self.audit
        source_audit = (
            f"records:{a.get('source_records')},dup:{a.get('duplicates')},miss:{a.get('missing')},"
            f"unexpected:{a.get('unexpected')},dropped:{a.get('dropped')},"
            f"dead_letters:{a.get('dead_letters')}"
        )
        q = self.ss
        ss = (
            f"records:{q.get('records')},out:{q.get('out')},dup:{q.get('dup')},miss:{q.get('miss')},"
            f"audit_ok:{q.get('audit_ok')}"
            if q
            else "none"
        )
        return (
            f"torture: seed={self.seed} cycles={self.cycles} faults={self.faults} kinds={kinds} "
            f"in={self.records_in} out={self.records_out} dead_letters={self.dead_letters_out} "
            f"duplicates={self.duplicates} "
            f"missing={self.missing} by_value=dup:{self.value_duplicates},miss:{self.value_missing} "
            f"source_audit={source_audit} ss_sink={ss} group_offsets_ok={self.group_offsets_ok} "
            f"violations={len(self.violations)} misrefused={len(self.misrefused)} "
            f"bench_crashes={len(self.bench_crashes)}"
        )


class Postgres:
    """The ledger's PostgreSQL cluster, driven by ``scripts/postgres.sh`` in ``state_dir``."""

    def __init__(self, state_dir: Path | None) -> None:
        # A cluster of its own (the run stops it): EO_PG_CLUSTER=torture next to the default
        # one, where the server's user can reach it, unless a folder is given.
        self.env = {**os.environ, "EO_PG_CLUSTER": "torture"}
        if state_dir is not None:
            self.env = {**os.environ, "EO_PG_DIR": str(state_dir)}

    def _script(self, action: str) -> dict[str, str]:
        proc = subprocess.run(
            ["bash", str(PG_SCRIPT), action], env=self.env, capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0 and action != "status":
            raise RuntimeError(f"postgres.sh {action} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)

    def running(self) -> bool:
        return "EO_PG_URL" in self._script("status")

    def start(self) -> str:
        """Start (idempotent); the URL of the maintenance database ``eo``."""
        return self._script("start")["EO_PG_URL"]

    def stop(self) -> None:
        self._script("stop")


class Feeder:
    """Produces source records until halted: unique values ``<tag>:<seq>:...``, ~20% null
    keys, some in committed and some in aborted transactions, ~1% just under the topic's
    ``max.message.bytes``. Survives broker errors (failed clients are re-created).

    It runs in a child process of its own (:class:`FeederProcess`, ``--feed``): a librdkafka
    crash of its clients ends that child, never the run."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        seed: int,
        rate: float,
        log: Callable[[str], None],
        *,
        tag: str,
        transactional_id: str,
        generation: int = 0,
    ) -> None:
        self.bootstrap, self.topic, self.rate, self.log = bootstrap, topic, rate, log
        self.rng = random.Random(seed * 7919 + 1 + generation)
        self.tag, self.transactional_id = tag, transactional_id
        self.halt = threading.Event()
        self.seq = 0
        self.errors = 0
        self.batches: Counter[str] = Counter()
        self._plain: Producer | None = None
        self._txn: Producer | None = None

    def _conf(self) -> dict[str, Any]:
        # Batches stay under the topic's 64 KiB max.message.bytes (librdkafka does not split
        # a batch the broker refuses as too large).
        return {"bootstrap.servers": self.bootstrap, "batch.size": 60_000, "linger.ms": 5, "log_level": 2}

    def _record(self) -> tuple[bytes | None, bytes]:
        self.seq += 1
        key = None if self.rng.random() < 0.2 else f"k{self.rng.randrange(50)}".encode()
        head = f"{self.tag}:{self.seq}:".encode()
        if self.rng.random() < 0.01:
            size = MAX_MESSAGE_BYTES - self.rng.randint(1024, 2048)  # room for eo's headers
            return key, head + b"L" * (size - len(head))
        return key, head + b"x" * self.rng.randint(10, 200)

    def _send(self, producer: Producer, n: int) -> None:
        for _ in range(n):
            key, value = self._record()
            while True:
                try:
                    producer.produce(self.topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.1)

    def _plain_batch(self, n: int) -> None:
        if self._plain is None:
            self._plain = Producer(
                {**self._conf(), "enable.idempotence": True, "message.timeout.ms": 120_000}
            )
        self._send(self._plain, n)
        self._plain.poll(0)

    def _txn_batch(self, n: int, commit: bool) -> None:
        try:
            if self._txn is None:
                # The same transactional.id in every feeder process of the run: a new one's
                # init_transactions fences and aborts what a crashed one left open.
                self._txn = Producer(
                    {
                        **self._conf(),
                        "transactional.id": self.transactional_id,
                        "transaction.timeout.ms": 10_000,
                    }
                )
                self._txn.init_transactions(30)
            self._txn.begin_transaction()
            self._send(self._txn, n)
            if commit:
                self._txn.commit_transaction(30)
            else:
                self._txn.flush(30)
                self._txn.abort_transaction(30)
            self.batches["txn_commit" if commit else "txn_abort"] += 1
        except KafkaException as exc:
            # Whatever became of it, the source itself says (read_committed vs uncommitted).
            self.errors += 1
            self.log(f"feeder: transaction failed ({exc}); new producer")
            self._txn = None  # the next init_transactions fences and aborts it
            self.halt.wait(1.0)

    def run(self) -> None:
        while not self.halt.is_set():
            n = self.rng.randint(1, 20)
            r = self.rng.random()
            try:
                if r < 0.15:
                    self._txn_batch(n, commit=False)
                elif r < 0.30:
                    self._txn_batch(n, commit=True)
                else:
                    self._plain_batch(n)
                    self.batches["plain"] += 1
            except KafkaException as exc:
                self.errors += 1
                self.log(f"feeder: {exc}; new producer")
                self._plain = None
            self.halt.wait(n / self.rate)
        if self._plain is not None and self._plain.flush(120) > 0:
            self.log("feeder: some plain records were not delivered (the audit reads the source)")


def feed_main(args: argparse.Namespace) -> int:
    """The feeder child (``--feed``): produce until SIGTERM, then print its counts as JSON."""
    feeder = Feeder(
        args.bootstrap,
        args.topic,
        args.seed,
        args.rate,
        _stderr,
        tag=args.tag,
        transactional_id=args.transactional_id,
        generation=args.generation,
    )
    signal.signal(signal.SIGTERM, lambda *_: feeder.halt.set())
    feeder.run()
    stats = {"seq": feeder.seq, "errors": feeder.errors, "batches": dict(feeder.batches)}
    print(json.dumps(stats), flush=True)
    return 0


class FeederProcess:
    """The run's feeder as a child process (``bench/torture.py --feed``), one generation at
    a time: re-created after every broker restart (clients that never saw the old broker),
    and started again when it died (a librdkafka abort() of its clients is the bench's own
    crash: logged and counted in ``crashes``, never a violation; the audits read the source,
    so what it was sending when it died cannot hide or fake a duplicate or a loss).

    Every generation tags its values ``<tag>.<generation>`` (unique across generations) and
    shares one transactional id (a new generation fences what an old one left open)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        seed: int,
        rate: float,
        work: Path,
        log: Callable[[str], None],
        *,
        command: Sequence[str] | None = None,
    ) -> None:
        self.bootstrap, self.topic, self.seed, self.rate = bootstrap, topic, seed, rate
        self.work, self.log = work, log
        self.tag = f"{seed}-{uuid.uuid4().hex[:6]}"
        self.transactional_id = f"torture-feed-{self.tag}"
        # The child's command line without its arguments (a test gives another program).
        self.command = list(command or [sys.executable, str(Path(__file__).resolve()), "--feed"])
        self.generation = -1
        self.seq = 0  # records sent by the generations that ended and reported
        self.errors = 0
        self.batches: Counter[str] = Counter()
        self.crashes: list[str] = []  # generations that died without being asked to
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the next generation."""
        self.generation += 1
        g = self.generation
        err = (self.work / f"feeder-{g}.log").open("ab")
        options = {
            "--bootstrap": self.bootstrap,
            "--topic": self.topic,
            "--seed": str(self.seed),
            "--rate": str(self.rate),
            "--tag": f"{self.tag}.{g}",
            "--transactional-id": self.transactional_id,
            "--generation": str(g),
        }
        self.proc = subprocess.Popen(
            [*self.command, *(a for pair in options.items() for a in pair)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        err.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> bool:
        """Start a new generation when the current one died; True when it had died."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return False
        self._ended(proc, asked=False)
        self.start()
        return True

    def restart(self, why: str) -> None:
        """End the current generation (or note its crash) and start the next one."""
        self.stop()
        self.log(f"  feeder re-created ({why}): generation {self.generation + 1}")
        self.start()

    def stop(self, timeout_s: float = 180.0) -> None:
        """Ask the current generation to stop (SIGTERM: it flushes and reports), SIGKILL it
        after ``timeout_s``."""
        proc = self.proc
        if proc is None:
            return
        asked = proc.poll() is None
        if asked:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.log(
                    f"  feeder generation {self.generation} still running after {timeout_s:.0f}s: SIGKILL"
                )
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
        self._ended(proc, asked=asked)

    def _ended(self, proc: subprocess.Popen[str], *, asked: bool) -> None:
        out = proc.stdout.read() if proc.stdout is not None else ""
        if proc.stdout is not None:
            proc.stdout.close()
        self.proc = None
        stats: dict[str, Any] = {}
        for line in out.splitlines():
            try:
                stats = json.loads(line)
            except ValueError:
                continue
        self.seq += int(stats.get("seq", 0))
        self.errors += int(stats.get("errors", 0))
        self.batches.update(stats.get("batches", {}))
        if not asked or proc.returncode != 0:
            what = (
                f"feeder generation {self.generation} died (exit {proc.returncode}; "
                f"see feeder-{self.generation}.log)"
            )
            self.crashes.append(what)
            self.log(f"  BENCH CLIENT CRASH (not a violation): {what}")


def _digest(value: bytes | None) -> bytes:
    return hashlib.blake2b(value or b"", digest_size=16).digest()


def _why(error: str, chars: int = 300) -> str:
    """The part of a streaming query's error that says why: from eo's error class on (Spark
    wraps it in the query's plan), else its beginning."""
    at = error.find("airflow_provider_eo.errors.")
    return error[at : at + chars] if at >= 0 else error[:chars]


def _process_state(pid: int) -> str:
    """The state letter of process ``pid`` (``T`` stopped, ``Z`` a zombie); ``""`` when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return ""


def _resume_and_reap(pid: int, timeout_s: float = 120.0) -> bool:
    """SIGCONT a stopped process (not our child) and wait until it ended: True, or False
    when it had to be SIGKILLed after ``timeout_s``."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _process_state(pid) in ("", "Z"):
            return True
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return False


def read_uncommitted(config: dict[str, Any], topic: str, timeout_s: float = 120.0) -> list[Any]:
    """Every record in ``topic`` up to its high watermark, aborted transactions included."""
    parts = admin.partitions_of(config, [topic])[topic]
    ends = high_watermarks(config, [(topic, p) for p in parts])
    return read_topic(config, topic, ends, isolation="read_uncommitted", timeout_s=timeout_s)


@dataclass
class SsQuery:
    """ss_new_location's Structured Streaming query: identity over the run's source into a
    sink topic of its own, its ledger a SQLite file (stale_ledger and stop_postgres leave it
    alone), started from ``location`` (a new one once a new query continues it)."""

    name: str
    sink_topic: str
    ledger_url: str
    staging_dir: str
    root: Path
    locations: int = 0  # checkpoint locations made after the first (ckpt-0)
    location: str = ""  # the query's current checkpoint location

    def __post_init__(self) -> None:
        self.location = self.location or str(self.root / "ckpt-0")


class Torture:
    """One torture run's stack, pipeline, feeder and chaos driver (see the module doc)."""

    def __init__(
        self,
        *,
        seed: int,
        work: Path,
        pg_dir: Path | None,
        spark: Any,
        source_partitions: int,
        sink_partitions: int,
        commit_shards: int,
        max_records: int,
        transaction_timeout_ms: int,
        rate: float,
        log: Callable[[str], None],
    ) -> None:
        self.seed, self.work, self.spark, self.log = seed, work, spark, log
        self.config: dict[str, Any] = {}
        self.rng = random.Random(seed)
        self.source_partitions, self.sink_partitions = source_partitions, sink_partitions
        self.commit_shards, self.max_records = commit_shards, max_records
        self.transaction_timeout_ms, self.rate = transaction_timeout_ms, rate
        # A transaction past its timeout is aborted within half a second (the broker looks
        # every 10 s by default): stop_commit's wait for the broker's abort ends sooner.
        self.kafka = LocalKafka(
            home=work / "kafka",
            extra_config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"},
        )
        self.pg = Postgres(pg_dir)
        self.pg_was_running = False
        self.db_name = f"torture_{uuid.uuid4().hex[:10]}"
        self.pg_url = ""
        self.port = 0
        self.pipeline: Pipeline | None = None
        self.ledger: Ledger | None = None
        self.feeder: FeederProcess | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self._last_code: int | None = None  # exit code of the last reaped child
        self.violations: list[str] = []  # a fault kind's own check that failed
        self.misrefused: list[str] = []  # refused safely, but not with the error expected
        self.snapshot_db: str | None = None  # stale_ledger's old copy, while it exists
        self.ss: SsQuery | None = None  # ss_new_location's query, from its first cycle
        self._ss_spark: Any = None  # a session of its own when the run prepares in children

    # -- set-up and tear-down ------------------------------------------------------------
    def up(self) -> None:
        self.log(f"starting a broker under {self.kafka.home}")
        info = self.kafka.up(timeout_s=120)
        self.port = info.port
        self.pg_was_running = self.pg.running()
        server = self.pg.start()
        self._pg_admin(f'CREATE DATABASE "{self.db_name}"', server)
        self.pg_url = server.rsplit("/", 1)[0] + f"/{self.db_name}"
        config = self.config = {"bootstrap.servers": info.bootstrap}
        source, sink = f"torture-src-{self.seed}", f"torture-sink-{self.seed}"
        dlq = f"torture-dlq-{self.seed}"
        admin.ensure_topic(
            config,
            source,
            partitions=self.source_partitions,
            topic_config={"max.message.bytes": str(SOURCE_MAX_MESSAGE_BYTES)},
        )
        admin.ensure_topic(
            config,
            sink,
            partitions=self.sink_partitions,
            topic_config={"max.message.bytes": str(MAX_MESSAGE_BYTES)},
        )
        admin.ensure_topic(
            config, dlq, partitions=2, topic_config={"max.message.bytes": str(DLQ_REPAIRED_BYTES)}
        )
        self.pipeline = Pipeline(
            name=f"torture-{self.seed}-{uuid.uuid4().hex[:6]}",
            # librdkafka's default batch.size (1 MB) against this 64 KiB sink wedged the commit
            # (found by this run, seed 11): the publisher now keeps batches below the topic's
            # max.message.bytes itself, so no batch.size is given here.
            kafka=dict(config),
            source_topics=[source],
            sink_topic=sink,
            # A copy of each record, except that it fails on a value starting with b"POISON"
            # (only oversize_dead_letter's records do): such a record becomes a dead letter.
            transform="eo_test_transforms:poison_prefix",
            dead_letter_topic=dlq,
            max_dead_letters_per_checkpoint=3,
            ledger_url=self.pg_url,
            staging_dir=str(self.work / "staging"),
            max_records_per_checkpoint=self.max_records,
            commit_shards=self.commit_shards,
            transaction_timeout_ms=self.transaction_timeout_ms,
            # Two unfinished checkpoints at once: abort_race aims at N+1 while N commits.
            max_pending=2,
        )
        self.ledger = Ledger(self.pg_url)
        self.log(f"pipeline {self.pipeline.name}: ledger {self.pg_url}, broker {info.bootstrap}")
        self.feeder = FeederProcess(info.bootstrap, source, self.seed, self.rate, self.work, self.log)
        self.feeder.start()

    def _pg_admin(self, sql: str, server: str) -> None:
        from sqlalchemy import create_engine

        engine = create_engine(server.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(sql)
        finally:
            engine.dispose()

    def down(self) -> None:
        self._reap()
        if self.feeder is not None:
            self.feeder.stop()
        if self._ss_spark is not None:
            self._ss_spark.stop()
        # While the broker still answers: clients left to the interpreter's exit would wait
        # on a stopped broker's connections.
        admin.close_shared_clients()
        close_producers()  # the in-process commits' kept producers, likewise
        if self.ledger is not None:
            self.ledger.close()
        try:
            server = self.pg.start()
            self._pg_admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)', server)
            if self.snapshot_db is not None:
                self._pg_admin(f'DROP DATABASE IF EXISTS "{self.snapshot_db}" WITH (FORCE)', server)
        finally:
            if not self.pg_was_running:
                self.pg.stop()
            self.kafka.wipe()

    # -- children --------------------------------------------------------------------------
    def _env(self, pipeline: Pipeline | None = None) -> dict[str, str]:
        """A child's environment: the pipeline (``pipeline`` or the run's) as JSON, no fault
        unless asked for."""
        assert self.pipeline is not None
        env = {
            **os.environ,
            "EO_TEST_PIPELINE_JSON": (pipeline or self.pipeline).to_json(),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS), str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
            "PYSPARK_PYTHON": sys.executable,
        }
        for name in ("EO_FAULT", "EO_FAULT_ACTION", "EO_FAULT_HIT", "EO_FAULT_ONCE"):
            env.pop(name, None)
        return env

    def _spawn(
        self,
        cycle: int,
        fault: str | None = None,
        action: str = "kill",
        *,
        hit: int = 1,
        args: Sequence[str] = ("run-once", REF, "--json"),
        log_name: str | None = None,
        pipeline: Pipeline | None = None,
        once: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``eo <args>`` (run-once by default) as the cycle's child; ``fault`` fires
        the ``hit``-th time the child reaches it (``hit=2`` of a commit step: in the second
        commit shard, after the first committed); with ``once``, only in the first of the
        child's processes that gets there (``EO_FAULT_ONCE``: a Spark task's Python worker)."""
        env = self._env(pipeline)
        if fault:
            env["EO_FAULT"], env["EO_FAULT_ACTION"], env["EO_FAULT_HIT"] = fault, action, str(hit)
            if once is not None:
                env["EO_FAULT_ONCE"] = str(once)
        self._last_code = None
        out = (self.work / (log_name or f"cycle-{cycle:04d}.log")).open("ab")
        # Its own process group: a kill takes the child's Spark JVM with it.
        self.child = subprocess.Popen(
            [EO, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        return self.child

    def _signal(self, sig: int) -> None:
        if self.child is not None:
            try:
                os.killpg(self.child.pid, sig)
            except ProcessLookupError:
                pass

    def _reap(self, timeout_s: float = 300.0) -> int | None:
        """Wait for the child (killing it after ``timeout_s``); sweep its process group."""
        child = self.child
        if child is None:
            return None
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.log(f"child {child.pid} still running after {timeout_s:.0f}s: SIGKILL")
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
            code = child.wait(timeout=60)
        self._signal(signal.SIGKILL)  # leftovers (a JVM) of a killed child
        self.child = None
        self._last_code = code
        return code

    def _exited(self) -> bool:
        return self.child is None or self.child.poll() is not None

    def _wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``predicate`` until true (True), the child exits or the deadline (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            if self._exited():
                return predicate()
            time.sleep(0.1)
        return False

    def _state(self) -> str:
        assert self.child is not None
        try:
            return Path(f"/proc/{self.child.pid}/stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            return "?"

    # -- ledger helpers ---------------------------------------------------------------------
    def _unfinished(self) -> Any:
        assert self.ledger is not None and self.pipeline is not None
        try:
            return self.ledger.unfinished(self.pipeline.name)
        except Exception:  # the ledger may be down (a stop_postgres cycle) or not registered yet
            return None

    def _prepare_here(self) -> None:
        """Plan and prepare in this process's Spark session (``--prepare mixed``)."""
        from airflow_provider_eo.core.plan import plan_checkpoint
        from airflow_provider_eo.core.prepare import prepare_checkpoint
        from airflow_provider_eo.spark.stager import SparkStager

        assert self.ledger is not None and self.pipeline is not None
        try:
            cp = plan_checkpoint(self.pipeline, self.ledger)
            if cp is not None and cp.state is CheckpointState.PLANNED:
                stager = SparkStager(self.spark)
                prepare_checkpoint(self.pipeline, self.ledger, cp.checkpoint_id, stager=stager)
        except Exception as exc:  # the child's run-once retries whatever failed here
            self.log(f"  in-process prepare failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _commit_here(self) -> None:
        from airflow_provider_eo.core.commit import commit_checkpoint

        assert self.ledger is not None and self.pipeline is not None
        cp = self._unfinished()
        if cp is not None and cp.state is CheckpointState.PREPARED:
            try:
                commit_checkpoint(self.pipeline, self.ledger, cp.checkpoint_id)
            except Exception as exc:
                self.log(f"  in-process commit failed: {type(exc).__name__}: {str(exc)[:200]}")

    # -- faults: each returns a description when injected, None when missed ------------------
    def cycle(self, n: int, kind: str) -> tuple[str | None, int | None]:
        """Run one cycle with fault ``kind``: (what was injected or None, child exit code)."""
        if self.spark is not None and kind != "kill_prepare":
            self._prepare_here()
        fn = getattr(self, f"_fault_{kind}")
        try:
            injected = fn(n)
        finally:
            self._reap()
        return injected, self._last_code

    def _fault_none(self, n: int) -> str | None:
        self._spawn(n)
        return "none"

    def _fault_kill_prepare(self, n: int) -> str | None:
        cp = self._unfinished()
        if cp is not None and cp.state is CheckpointState.PREPARED:
            self._commit_here()  # so that the child has a checkpoint to prepare
        if self.rng.random() < 0.5:
            step = self.rng.choice(("prepare.after_write", "prepare.before_ledger"))
            self._spawn(n, fault=step)
            self._reap()
            return f"EO_FAULT={step}" if self._last_code_killed() else None
        delay = self.rng.uniform(1.0, 15.0)
        self._spawn(n)

        def planned() -> bool:
            cp = self._unfinished()
            return cp is not None and cp.state is CheckpointState.PLANNED

        if not self._wait(planned, 120) or self._exited():
            return None
        time.sleep(delay)  # the random moment inside prepare is the fault itself
        if self._exited():
            return None
        self._signal(signal.SIGKILL)
        return f"SIGKILL {delay:.1f}s after plan"

    def _last_code_killed(self) -> bool:
        return self._last_code == -signal.SIGKILL

    def _fault_kill_commit(self, n: int) -> str | None:
        step = self.rng.choice(KILL_COMMIT_STEPS)
        self._spawn(n, fault=step)
        self._reap()
        return f"EO_FAULT={step}" if self._last_code_killed() else None

    def _fault_stop_commit(self, n: int) -> str | None:
        assert self.pipeline is not None
        step = self.rng.choice(("commit.after_begin", "commit.before_commit_txn"))
        resume = self.rng.random() < 0.5
        child = self._spawn(n, fault=step, action="pause")
        if not self._wait(lambda: self._state() == "T", 180):
            return None
        paused = time.monotonic()
        sink = [(self.pipeline.sink_topic, p) for p in range(self.sink_partitions)]
        config = self.config

        def aborted_by_broker() -> bool:
            # Past the timeout, and the broker has aborted the open transaction (LSO = HW).
            if time.monotonic() - paused < self.transaction_timeout_ms / 1000 + 1:
                return False
            try:
                return admin.list_offsets(config, sink, spec="latest") == high_watermarks(config, sink)
            except Exception:
                return False

        deadline = time.monotonic() + self.transaction_timeout_ms / 1000 + 60
        while time.monotonic() < deadline and not aborted_by_broker():
            time.sleep(0.5)
        waited = time.monotonic() - paused
        if resume:
            os.kill(child.pid, signal.SIGCONT)
        else:
            self._signal(signal.SIGKILL)
        return f"SIGSTOP at {step} for {waited:.1f}s, then {'SIGCONT' if resume else 'SIGKILL'}"

    def _fault_restart_broker(self, n: int) -> str | None:
        delay = self.rng.uniform(1.0, 5.0)
        hard = self.rng.random() < 0.5
        self._spawn(n)
        time.sleep(delay)  # a random moment in the run-once is the fault itself
        in_flight = not self._exited()
        old = self.kafka.info()
        # This process's own clients (admin, group readers) are closed while the broker still
        # answers and made afresh after it is back: a librdkafka client that lived through
        # the broker's SIGKILL and restart aborted the whole bench process once
        # (rd_kafka_enq_once_del_source_return). The feeder, a child process, goes on
        # producing through the restart (its crash would be the bench's, not eo's) and is
        # re-created once the broker is back.
        admin.close_shared_clients()
        self.kafka.down(timeout_s=0.0 if hard else 30.0)
        # down() sends SIGKILL without waiting: the next up() must not see the dying broker
        # still holding its ports (it would move to new ones).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            (old is not None and pid_alive(old.pid)) or port_in_use(self.port)
        ):
            time.sleep(0.1)
        info = self.kafka.up(timeout_s=180)
        if info.port != self.port:
            raise RuntimeError(f"the broker came back on port {info.port}, not {self.port}")
        admin.close_shared_clients()  # any made while it was down
        assert self.feeder is not None
        self.feeder.restart("broker restarted")
        how = "SIGKILL" if hard else "SIGTERM"
        return f"broker {how} {delay:.1f}s into the run{'' if in_flight else ' (child had exited)'}"

    def _fault_stop_postgres(self, n: int) -> str | None:
        delay = self.rng.uniform(1.0, 5.0)
        outage = self.rng.uniform(1.0, 8.0)
        self._spawn(n)
        time.sleep(delay)  # a random moment in the run-once is the fault itself
        in_flight = not self._exited()
        self.pg.stop()
        self._wait(lambda: False, outage)  # down for `outage` s, or until the child gave up
        moved = self._pg_back(self.pg.start())
        return f"PostgreSQL down {delay:.1f}s into the run{'' if in_flight else ' (child had exited)'}{moved}"

    def _pg_back(self, server: str) -> str:
        """Point the pipeline at the restarted server: scripts/postgres.sh picks a new port
        when the old one is still in TIME_WAIT, as an operator's failover would."""
        from dataclasses import replace

        assert self.pipeline is not None and self.ledger is not None
        url = server.rsplit("/", 1)[0] + f"/{self.db_name}"
        if url == self.pg_url:
            return ""
        self.pg_url = url
        self.pipeline = replace(self.pipeline, ledger_url=url)
        self.ledger.close()
        self.ledger = Ledger(url)
        return f" (back on {url.rsplit('@', 1)[1]})"

    # -- the checks a fault kind makes on the spot -------------------------------------------
    def _violation(self, msg: str) -> None:
        self.violations.append(msg)
        self.log(f"  VIOLATION: {msg}")

    def _sink(self) -> list[tuple[str, int]]:
        assert self.pipeline is not None
        return [(self.pipeline.sink_topic, p) for p in range(self.sink_partitions)]

    def _quiet_sink_ends(self, timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
        """The sink's high watermarks once no transaction is open on it (last stable offset =
        high watermark), so that nothing but a publish can move them afterwards."""
        deadline = time.monotonic() + timeout_s
        while True:
            ends = high_watermarks(self.config, self._sink())
            if admin.list_offsets(self.config, self._sink(), spec="latest") == ends:
                return ends
            if time.monotonic() > deadline:
                self.log("  the sink still has an open transaction; comparing high watermarks anyway")
                return ends
            time.sleep(0.5)

    def _check_sink_unchanged(self, before: dict[tuple[str, int], int], what: str) -> None:
        after = high_watermarks(self.config, self._sink())
        if after != before:
            moved = {p: (before.get((t, p)), o) for (t, p), o in after.items() if before.get((t, p)) != o}
            self._violation(f"{what}: the sink moved {moved}")

    def _child_text(self, name: str) -> str:
        """A child's log, whitespace-normalised (the CLI wraps its error messages)."""
        try:
            return " ".join((self.work / name).read_text(errors="replace").split())
        except OSError:
            return ""

    def _state_of(self, checkpoint_id: int) -> CheckpointState:
        assert self.ledger is not None and self.pipeline is not None
        return self.ledger.get(self.pipeline.name, checkpoint_id).state

    def _last_committed_id(self) -> int | None:
        assert self.ledger is not None and self.pipeline is not None
        try:
            cp = self.ledger.last_committed(self.pipeline.name)
        except Exception:  # not registered yet
            return None
        return None if cp is None else cp.checkpoint_id

    def _advance(self, n: int) -> bool:
        """One clean run-once (in this process with ``--prepare mixed``, else a child)."""
        from airflow_provider_eo.core.runner import run_once
        from airflow_provider_eo.spark.stager import SparkStager

        assert self.pipeline is not None and self.ledger is not None
        if self.spark is None:
            self._spawn(n, log_name=f"cycle-{n:04d}-advance.log")
            return self._reap() == 0
        try:
            run_once(self.pipeline, ledger=self.ledger, stager=SparkStager(self.spark))
            return True
        except Exception as exc:
            self.log(f"  in-process run-once failed: {type(exc).__name__}: {str(exc)[:200]}")
            return False

    def _prepared(self, n: int) -> Any:
        """The unfinished checkpoint once PREPARED (prepared by ``eo plan``/``eo prepare``
        children without a Spark session here), else None."""
        cp = self._unfinished()
        if self.spark is None and (cp is None or cp.state is CheckpointState.PLANNED):
            for step in ("plan", "prepare"):
                self._spawn(n, args=(step, REF), log_name=f"cycle-{n:04d}-{step}.log")
                self._reap()
            cp = self._unfinished()
        return cp if cp is not None and cp.state is CheckpointState.PREPARED else None

    def _side(self, n: int, how: str, checkpoint_id: int) -> tuple[int, str]:
        """Run ``eo abort <ref> <id>`` or ``eo recover <ref>`` beside the child: (exit, log)."""
        args = (
            [EO, "abort", REF, str(checkpoint_id), "--reason", "torture abort_race"]
            if how == "abort"
            else [EO, "recover", REF, "--wait", "15"]
        )
        return self._call(n, how, args)

    def _call(self, n: int, name: str, args: Sequence[str]) -> tuple[int, str]:
        """Run ``args`` (an ``eo`` command) to its end beside the cycle: (exit, its log)."""
        log_name = f"cycle-{n:04d}-{name}.log"
        with (self.work / log_name).open("ab") as out:
            proc = subprocess.run(
                args, env=self._env(), stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False
            )
        return proc.returncode, self._child_text(log_name)

    # -- the new fault kinds ---------------------------------------------------------------------
    def _fault_abort_race(self, n: int) -> str | None:
        from airflow_provider_eo.core.plan import plan_checkpoint
        from airflow_provider_eo.core.prepare import prepare_checkpoint
        from airflow_provider_eo.spark.stager import SparkStager

        assert self.pipeline is not None and self.ledger is not None
        cp = self._prepared(n)
        if cp is None:
            return None
        target = cp.checkpoint_id
        if self.rng.random() < 0.5:
            # Checkpoint N+1 beside N (max_pending=2), sometimes prepared too.
            try:
                nxt = plan_checkpoint(self.pipeline, self.ledger, next_only=True)
                if nxt is not None:
                    target = nxt.checkpoint_id
                    if self.spark is not None and self.rng.random() < 0.5:
                        prepare_checkpoint(self.pipeline, self.ledger, target, stager=SparkStager(self.spark))
            except Exception as exc:
                self.log(f"  planning checkpoint N+1 failed: {type(exc).__name__}: {str(exc)[:200]}")
        how = "abort" if self.rng.random() < 0.75 else "recover"
        aim = f"abort {target}" if how == "abort" else "recover"
        if target != cp.checkpoint_id:
            aim += f" (N+1 = {target} {self._state_of(target).value} beside it)"
        if self.rng.random() < 0.5:
            # The committer of N paused holding its commit lease (50 s): the side call must be
            # refused and change nothing; once resumed, the commit finishes.
            step = self.rng.choice(
                ("commit.after_begin", "commit.before_commit_txn", "commit.before_end_txn")
            )
            child = self._spawn(n, fault=step, action="pause")
            if not self._wait(lambda: self._state() == "T", 180):
                return None
            code, text = self._side(n, how, target)
            states = {c: self._state_of(c) for c in sorted({cp.checkpoint_id, target})}
            if code == 0 or any(s is CheckpointState.ABORTED for s in states.values()):
                self._violation(
                    f"{how} while the commit of checkpoint {cp.checkpoint_id} was paused at {step} "
                    f"holding its lease: exit {code}, states {states}: {text[-300:]}"
                )
            os.kill(child.pid, signal.SIGCONT)
            code_child = self._reap()
            return (
                f"{aim} during the commit of {cp.checkpoint_id} paused at {step}: exit {code}; "
                f"commit resumed, exit {code_child}"
            )
        delay = self.rng.uniform(0.0, 4.0)
        self._spawn(n)
        time.sleep(delay)  # a random moment in the commit is the fault itself
        code, text = self._side(n, how, target)
        code_child = self._reap()
        now = {c: self._state_of(c).value for c in sorted({cp.checkpoint_id, target})}
        outcome = "refused" if code else "done"
        if code and "Traceback" in text:
            self._violation(f"{how} racing the commit of {cp.checkpoint_id} crashed: {text[-300:]}")
        return (
            f"{aim} {delay:.1f}s into the commit of {cp.checkpoint_id}: {outcome}; "
            f"run-once exit {code_child}; now {now}"
        )

    def _pg_kick(self, *dbs: str) -> None:
        """End every connection to ``dbs`` (a copy or rename needs the database unused)."""
        names_ = ", ".join(f"'{d}'" for d in dbs)
        self._pg_admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname IN ({names_}) AND pid <> pg_backend_pid()",
            self.pg_url,
        )

    def _pg_swap(self, a: str, b: str) -> None:
        """Exchange databases ``a`` and ``b`` by renaming (the ledger connection is reopened)."""
        assert self.ledger is not None
        self.ledger.close()
        self._pg_kick(a, b)
        tmp = f"{a}_swap"
        for old, new in ((a, tmp), (b, a), (tmp, b)):
            self._pg_admin(f'ALTER DATABASE "{old}" RENAME TO "{new}"', self.pg_url)
        self.ledger = Ledger(self.pg_url)

    def _fault_stale_ledger(self, n: int) -> str | None:
        assert self.pipeline is not None and self.ledger is not None
        if self._last_committed_id() is None:
            self._advance(n)  # a ledger with a commit behind it, or this is a re-created one
        if self._last_committed_id() is None:
            return None
        if self.rng.random() < 0.5:
            self._commit_here()  # nothing unfinished in the copy: the plan's check refuses
        # else the copy holds an unfinished checkpoint: the commit's marker check refuses it
        snap = self.snapshot_db = f"{self.db_name}_old"
        self.ledger.close()
        self._pg_kick(self.db_name)
        self._pg_admin(f'CREATE DATABASE "{snap}" TEMPLATE "{self.db_name}"', self.pg_url)
        self.ledger = Ledger(self.pg_url)
        try:
            copy_last = self.ledger.get_pipeline(self.pipeline.name).last_checkpoint_id
            copy_open = self._unfinished()
            held = f"{copy_open.checkpoint_id} {copy_open.state.value}" if copy_open else "nothing unfinished"
            for _ in range(6):  # commit past the copy
                self._advance(n)
                newest = self._last_committed_id()
                if newest is not None and newest > copy_last:
                    break
            else:
                return None
            before = self._quiet_sink_ends()
            self._pg_swap(self.db_name, snap)  # the old copy is the ledger now
            try:
                log_name = f"cycle-{n:04d}-stale.log"
                self._spawn(n, log_name=log_name)
                code = self._reap()
                text = self._child_text(log_name)
                what = (
                    f"run-once on a ledger copy at checkpoint {copy_last} ({held}) "
                    f"while the sink holds {newest}"
                )
                if code == 0:
                    self._violation(f"{what}: exit 0, not refused: {text[-300:]}")
                elif "the ledger is older than the sink" not in text:
                    # Refused, but not as LedgerBehindSink: safe when the sink did not move
                    # (checked next), yet the operator is told the wrong thing.
                    self.misrefused.append(f"{what}: exit {code}: {text[-300:]}")
                    self.log(f"  MISREFUSED: {self.misrefused[-1]}")
                self._check_sink_unchanged(before, f"run-once on a ledger copy at checkpoint {copy_last}")
            finally:
                self._pg_swap(self.db_name, snap)  # the operator puts the newest ledger back
        finally:
            self._pg_admin(f'DROP DATABASE IF EXISTS "{snap}" WITH (FORCE)', self.pg_url)
            self.snapshot_db = None
        return (
            f"ledger replaced by a copy at checkpoint {copy_last} ({held}) while the sink holds "
            f"{newest}: exit {code}, sink unchanged; newest ledger back"
        )

    def _unhide(self, hidden: Path, target: Path) -> None:
        """Make ``hidden`` visible at ``target`` again (merged if something recreated it)."""
        if not hidden.exists():
            return
        if target.exists():
            shutil.copytree(hidden, target, dirs_exist_ok=True)
            shutil.rmtree(hidden)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(hidden, target)

    def _fault_hide_staging(self, n: int) -> str | None:
        if self.spark is not None and self.rng.random() < 0.5:
            return self._hide_during_prepare(n)
        return self._hide_before_commit(n)

    def _hide_before_commit(self, n: int) -> str | None:
        assert self.pipeline is not None and self.ledger is not None
        cp = self._prepared(n)
        if cp is None or not cp.staging_location:
            return None
        attempt = Path(cp.staging_location)
        what = self.rng.choice(("attempt", "checkpoint", "staging_dir"))
        target = {"attempt": attempt, "checkpoint": attempt.parent, "staging_dir": attempt.parents[2]}[what]
        hidden = self.work / "hidden" / f"cycle-{n:04d}-{what}"
        hidden.parent.mkdir(parents=True, exist_ok=True)
        from airflow_provider_eo.ledger import ShardState

        # A commit that had published every shard before it was stopped (e.g. the ledger lost
        # before the checkpoint's own transition) needs no staged data: a COMMITTED shard row
        # is final, so the commit must finish it publishing nothing, staging hidden or not.
        plan_shards = cp.commit_plan.shards if cp.commit_plan is not None else None
        published = plan_shards is not None and sorted(
            s.shard for s in cp.shards if s.state is ShardState.COMMITTED
        ) == list(range(plan_shards))
        before = self._quiet_sink_ends()
        os.rename(target, hidden)
        try:
            log_name = f"cycle-{n:04d}-hidden.log"
            self._spawn(n, log_name=log_name)
            code = self._reap()
            state = self._state_of(cp.checkpoint_id)
            text = self._child_text(log_name)
            if published:
                if code != 0 or state is not CheckpointState.COMMITTED:
                    self._violation(
                        f"commit of checkpoint {cp.checkpoint_id}, every shard already COMMITTED, "
                        f"with its {what} folder hidden: exit {code}, now {state.value} (must "
                        f"finish, publishing nothing): {text[-300:]}"
                    )
            elif code == 0 or state is not CheckpointState.PREPARED or "is not visible" not in text:
                self._violation(
                    f"commit of checkpoint {cp.checkpoint_id} with its {what} folder hidden: exit "
                    f"{code}, now {state.value}: {text[-300:]}"
                )
            self._check_sink_unchanged(before, f"commit of checkpoint {cp.checkpoint_id} with staging hidden")
        finally:
            self._unhide(hidden, target)
        done = " (every shard already COMMITTED: nothing to read)" if published else ""
        return (
            f"{what} folder of checkpoint {cp.checkpoint_id} hidden at commit{done}: exit {code}, "
            f"now {state.value}, sink unchanged; visible again"
        )

    def _hide_during_prepare(self, n: int) -> str | None:
        """The staged data moved away between the Spark write and the driver's listing (as if
        the executors wrote where the driver does not look): the prepare must refuse."""
        from unittest import mock

        from airflow_provider_eo import staging
        from airflow_provider_eo.core.plan import plan_checkpoint
        from airflow_provider_eo.core.prepare import StageRequest, StageResult, prepare_checkpoint
        from airflow_provider_eo.errors import StagingError
        from airflow_provider_eo.spark.stager import SparkStager

        assert self.pipeline is not None and self.ledger is not None
        cp = self._unfinished()
        if cp is not None and cp.state is CheckpointState.PREPARED:
            self._commit_here()  # a checkpoint to prepare
        try:
            cp = plan_checkpoint(self.pipeline, self.ledger)
        except Exception as exc:
            self.log(f"  plan failed: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        if cp is None or cp.state is not CheckpointState.PLANNED:
            return None
        hidden = self.work / "hidden" / f"cycle-{n:04d}-data"
        hidden.parent.mkdir(parents=True, exist_ok=True)
        seen: dict[str, Any] = {}
        spark_stager = SparkStager(self.spark)
        describe = staging.describe_attempt

        def driver_view(path: str) -> Any:
            data = Path(path) / "data"
            if data.exists():
                os.rename(data, hidden)
                seen["attempt"] = Path(path)
            return describe(path)

        class Counting:
            """The Spark stager, keeping what it reported (Spark's own write counts)."""

            def start(self, pipeline: Pipeline) -> None:
                spark_stager.start(pipeline)

            def stage(self, request: StageRequest) -> StageResult:
                seen["result"] = spark_stager.stage(request)
                return seen["result"]

        outcome = "prepared"
        with mock.patch.object(staging, "describe_attempt", driver_view):
            try:
                prepare_checkpoint(self.pipeline, self.ledger, cp.checkpoint_id, stager=Counting())
            except StagingError as exc:
                outcome = f"StagingError ({str(exc)[:80]}...)"
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {str(exc)[:200]}"
        written = sum((getattr(seen.get("result"), "rows_written", None) or {}).values())
        if "attempt" not in seen or written == 0:
            return None  # nothing staged to hide; the checkpoint is prepared as usual
        state = self._state_of(cp.checkpoint_id)
        if not outcome.startswith("StagingError") or state is not CheckpointState.PLANNED:
            self._violation(
                f"prepare of checkpoint {cp.checkpoint_id} with its {written} staged records hidden "
                f"from the driver: {outcome}, now {state.value}"
            )
        # Visible again, as an attempt without a manifest: never published; the retry
        # prepares a new attempt.
        self._unhide(hidden, seen["attempt"] / "data")
        self._spawn(n)
        code = self._reap()
        return (
            f"{written} staged records of checkpoint {cp.checkpoint_id} hidden from the driver's "
            f"listing: {outcome}, still {state.value}; visible again, retried: exit {code}"
        )

    # -- markers expired, a hanging transaction, an oversize dead letter ---------------------
    def _marker_group(self, cp: Any) -> str:
        assert self.pipeline is not None
        from airflow_provider_eo import names

        return (
            cp.commit_plan.marker_group if cp.commit_plan is not None else names.marker_group(self.pipeline)
        )

    def _open_on_sink(self) -> dict[int, tuple[int, int]]:
        """Sink partitions a transaction holds open: partition -> (last stable offset, high
        watermark), as a read_committed consumer sees them."""
        stable = admin.list_offsets(self.config, self._sink(), spec="latest")
        high = high_watermarks(self.config, self._sink())
        return {p: (stable[(t, p)], h) for (t, p), h in high.items() if stable.get((t, p), h) < h}

    def _duplicated_since(self, before: dict[tuple[str, int], int]) -> int:
        """Sink records at or past ``before`` (high watermarks taken before the cycle
        published) whose value the sink holds more than once: what this cycle published
        twice (identity transform: a value is its source record's)."""
        assert self.pipeline is not None
        msgs = read_sink(self.config, self.pipeline.sink_topic)
        counts = Counter(_digest(m.value()) for m in msgs)
        return sum(
            1
            for m in msgs
            if m.offset() >= before.get((m.topic(), m.partition()), 0) and counts[_digest(m.value())] > 1
        )

    def _dead_letters(self) -> list[Any]:
        assert self.pipeline is not None
        if not self.pipeline.dead_letter_topic:
            return []
        return read_sink(self.config, self.pipeline.dead_letter_topic)

    def _set_max_message_bytes(self, topic: str, value: int) -> None:
        """Set ``topic``'s max.message.bytes (an operator's ``kafka-configs --alter``)."""
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET)
            ],
        )
        futures = admin.admin_client(self.config).incremental_alter_configs([resource], request_timeout=30)
        for future in futures.values():
            future.result(timeout=60)

    def _recover_flags(self) -> list[str]:
        """``--abort-hanging`` when this eo's ``recover`` has it (ours, never a foreign
        transaction, once the ledger and markers say what it was)."""
        if not hasattr(self, "_abort_hanging"):
            proc = subprocess.run(
                [EO, "recover", "--help"], env=self._env(), capture_output=True, text=True, timeout=120
            )
            self._abort_hanging = "--abort-hanging" in proc.stdout
            self.log(
                f"  eo recover --abort-hanging {'available' if self._abort_hanging else 'not available'}"
            )
        return ["--abort-hanging"] if self._abort_hanging else []

    def _lease_run_out(self, checkpoint_id: int, timeout_s: float = 180.0) -> None:
        """Wait until no commit lease on ``checkpoint_id`` is live (a killed committer's runs
        out ``2 * transaction timeout + 30`` s after it took it): a new committer is refused
        while another holds one, however dead."""
        import datetime as dt

        assert self.ledger is not None and self.pipeline is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            until = self.ledger.get(self.pipeline.name, checkpoint_id).commit_lease_until
            if until is not None and until.tzinfo is None:
                until = until.replace(tzinfo=dt.timezone.utc)  # the ledger keeps UTC
            if until is None or until < dt.datetime.now(dt.timezone.utc):
                return
            time.sleep(0.5)
        self.log(f"  checkpoint {checkpoint_id}'s commit lease still live after {timeout_s:.0f}s")

    def _fault_expire_markers_abort(self, n: int) -> str | None:
        """Checkpoint N: shard 0 commits, the committer is killed inside shard 1's
        transaction, the commit markers expire (the marker group deleted, as retention does
        after ``offsets.retention.minutes``), then ``eo abort N --force-live``. Shard 0's
        COMMITTED row is proof of publication: the abort must be refused (the checkpoint
        stays PREPARED, the sink unchanged) and the next run-once finishes N without
        publishing shard 0 again."""
        assert self.pipeline is not None and self.ledger is not None
        from airflow_provider_eo.ledger import ShardState

        cp = self._prepared(n)
        if cp is not None and cp.shards:  # a commit of it began before: finish it first
            self._advance(n)
            if self.spark is not None:
                self._prepare_here()
            cp = self._prepared(n)
        if cp is None or cp.commit_plan is None or cp.commit_plan.shards < 2 or cp.shards:
            return None  # a PREPARED checkpoint of two shards or more, no commit begun
        if int(cp.shard_counts.get(0, 0)) == 0:
            return None  # nothing in shard 0 that could be published twice
        cid, sink = cp.checkpoint_id, cp.commit_plan.sink_topic
        self._spawn(n, fault="commit.before_commit_txn", hit=2)
        if self._reap() != -signal.SIGKILL:
            return None
        cp = self.ledger.get(self.pipeline.name, cid)
        rows = {s.shard: s.state for s in cp.shards}
        if (
            cp.state is not CheckpointState.PREPARED
            or rows.get(0) is not ShardState.COMMITTED
            or rows.get(1) is ShardState.COMMITTED
        ):
            return None  # not killed between the shards (a redo round of shard 0)
        group = self._marker_group(cp)
        shards = [(sink, s) for s in range(cp.commit_plan.shards)]
        mark = admin.committed_group_offsets(self.config, group, [(sink, 0)]).get((sink, 0))
        if mark != cid:
            self._violation(f"checkpoint {cid}: shard 0's row is COMMITTED but its marker shows {mark}")
        # The killed committer left shard 1's transaction open, its marker a pending offset
        # commit of the group: the broker deletes the group only once that transaction ended
        # (aborted for its timeout). What retention does after 7 idle days, here in seconds.
        deadline = time.monotonic() + self.transaction_timeout_ms / 1000 + 120
        while True:
            futures = admin.admin_client(self.config).delete_consumer_groups([group], request_timeout=30)
            try:
                futures[group].result(timeout=60)
                break
            except (KafkaException, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    self.log(f"  the marker group {group} could not be deleted: {exc}")
                    return None
                time.sleep(2)
        left = admin.committed_group_offsets(self.config, group, shards)
        if left:
            self.log(f"  the marker group {group} still shows {left} after its deletion")
            return None
        before = self._quiet_sink_ends()
        code, text = self._call(
            n,
            "abort",
            [EO, "abort", REF, str(cid), "--reason", "torture: markers expired", "--force-live"],
        )
        state = self._state_of(cid)
        if (
            code == 0
            or state is not CheckpointState.PREPARED
            or "publish" not in text.lower()
            or "Traceback" in text
        ):
            self._violation(
                f"abort of checkpoint {cid} (shard 0 COMMITTED, markers expired): exit {code}, "
                f"now {state.value} (must be refused, still PREPARED): {text[-300:]}"
            )
        self._check_sink_unchanged(before, f"abort of checkpoint {cid} with its markers expired")
        self._lease_run_out(cid)
        self._spawn(n)
        code_next = self._reap()
        now = self._state_of(cid)
        twice = self._duplicated_since(before)
        if code_next != 0 or now is not CheckpointState.COMMITTED or twice:
            self._violation(
                f"run-once after the abort of checkpoint {cid}: exit {code_next}, checkpoint "
                f"{now.value} (must be COMMITTED), {twice} sink records published again"
            )
        return (
            f"checkpoint {cid}: killed in shard 1 after shard 0 committed, marker group deleted; "
            f"abort --force-live exit {code} ({state.value}); run-once exit {code_next}, "
            f"{now.value}, {twice} published twice"
        )

    def _fault_hanging_txn(self, n: int) -> str | None:
        """A committer stopped (SIGSTOP) inside its transaction, then killed: its transaction
        hangs open on the sink (its timeout is long: ``HANG_TIMEOUT_MS``). ``eo recover``
        (``--abort-hanging`` when it has it) must end it: every sink partition's last stable
        offset reaches its high watermark, and the marker group's offsets read stable, well
        before the broker's timeout would; then the next run-once publishes exactly once."""
        assert self.pipeline is not None and self.ledger is not None
        from dataclasses import replace

        from airflow_provider_eo import names
        from airflow_provider_eo.ledger import ShardState

        cp = self._prepared(n)
        if cp is None or cp.commit_plan is None:
            return None
        cid, plan = cp.checkpoint_id, cp.commit_plan
        step = self.rng.choice(("commit.before_commit_txn", "commit.before_end_txn"))
        hit = self.rng.randint(1, plan.shards)
        hang = replace(self.pipeline, transaction_timeout_ms=HANG_TIMEOUT_MS)
        self._spawn(n, fault=step, action="pause", hit=hit, pipeline=hang)
        if not self._wait(lambda: self._state() == "T", 180):
            return None
        # Its transaction began at most a publish of one shard before the pause.
        paused = time.monotonic()
        held: dict[int, tuple[int, int]] = {}

        def hanging() -> bool:
            held.update(self._open_on_sink())
            return bool(held)

        deadline = time.monotonic() + 10
        while not hanging() and time.monotonic() < deadline:
            time.sleep(0.2)
        self._signal(signal.SIGKILL)
        self._reap()
        if not held:
            return None  # its shard had no records: nothing held open on the sink
        rows = {s.shard: s.state for s in self.ledger.get(self.pipeline.name, cid).shards}
        stuck = [
            names.plan_transactional_id(plan, self.pipeline.name, s)
            for s in range(plan.shards)
            if rows.get(s) is not ShardState.COMMITTED
        ]
        flags = self._recover_flags()
        if flags:
            # The fix that brings --abort-hanging lists open transactions in `eo doctor`.
            _code, text = self._call(n, "doctor", [EO, "doctor", REF, "--no-spark-probe"])
            if not any(t in text for t in stuck):
                self._violation(
                    f"eo doctor with checkpoint {cid}'s transaction hanging on {sorted(held)} does "
                    f"not name its transactional id (one of {stuck}): {text[-300:]}"
                )
        before = high_watermarks(self.config, self._sink())
        called = time.monotonic()
        code, text = self._call(n, "recover", [EO, "recover", REF, "--force-live", "--wait", "15", *flags])
        recovered = time.monotonic()
        if code != 0 or "Traceback" in text:
            self._violation(
                f"eo recover {' '.join(flags)} with a transaction hanging: exit {code}: {text[-300:]}"
            )
        # Only recover can end it before the broker's timeout (with a margin for the publish
        # before the pause).
        budget = HANG_TIMEOUT_MS / 1000 - 30
        limit = min(recovered + 30, paused + budget)
        still: dict[int, tuple[int, int]] = self._open_on_sink()
        while still and time.monotonic() < limit:
            time.sleep(0.2)
            still = self._open_on_sink()
        resolved = time.monotonic()
        if not still and recovered - paused > budget:
            still = held  # gone, but the broker's own timeout may have ended it: not shown
        if still:
            self._violation(
                f"transaction hanging on the sink after eo recover {' '.join(flags)} (checkpoint {cid}, "
                f"stopped at {step} hit {hit}): last stable < high watermark {still}, "
                f"{time.monotonic() - recovered:.0f}s after recover"
            )
        group = self._marker_group(cp)
        try:
            admin.committed_group_marks(
                self.config, group, [(plan.sink_topic, s) for s in range(plan.shards)], timeout_s=10
            )
        except Exception as exc:
            self._violation(f"marker group {group} not readable stable after eo recover: {exc}")
        state = self._state_of(cid)
        self._spawn(n)
        code_next = self._reap()
        twice = self._duplicated_since(before)
        if state is not CheckpointState.COMMITTED or code_next != 0 or twice:
            self._violation(
                f"after eo recover: checkpoint {cid} {state.value} (recover commits it), next "
                f"run-once exit {code_next}, {twice} sink records published twice"
            )
        return (
            f"SIGSTOP at {step} (hit {hit}), SIGKILL: open on {sorted(held)}; eo recover "
            f"{' '.join(flags)} exit {code}, {'still open' if still else 'resolved'} "
            f"{resolved - paused:.0f}s after the pause (recover {recovered - called:.0f}s); "
            f"checkpoint {cid} "
            f"{state.value}; run-once exit {code_next}, {twice} published twice"
        )

    def _inject(self, value: bytes) -> tuple[str, int, int]:
        """Produce one record (outside the feeder) into the source: its (topic, partition,
        offset)."""
        assert self.pipeline is not None and self.feeder is not None
        topic = self.pipeline.source_topics[0]
        got: list[Any] = []
        producer = Producer({**self.config, "enable.idempotence": True, "log_level": 2})
        producer.produce(
            topic, key=b"poison", value=value, on_delivery=lambda err, msg: got.append((err, msg))
        )
        if producer.flush(60) > 0 or not got or got[0][0] is not None:
            raise RuntimeError(f"torture: the injected record was not delivered: {got}")
        msg = got[0][1]
        return topic, msg.partition(), msg.offset()

    def _planned_over(self, n: int, position: tuple[str, int, int]) -> Any:
        """Finish checkpoints (clean runs) until a PLANNED one reads ``position``; it, or None."""
        assert self.pipeline is not None and self.ledger is not None
        from airflow_provider_eo.core.plan import plan_checkpoint

        topic, partition, offset = position
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            cp = self._unfinished()
            if cp is None:
                if self.spark is not None:
                    try:
                        plan_checkpoint(self.pipeline, self.ledger)
                    except Exception as exc:
                        self.log(f"  plan failed: {type(exc).__name__}: {str(exc)[:200]}")
                else:
                    self._spawn(n, args=("plan", REF), log_name=f"cycle-{n:04d}-plan.log")
                    self._reap()
                cp = self._unfinished()
            if cp is None:
                time.sleep(0.5)  # the record is behind an open feeder transaction: plan again
                continue
            if any(
                r.topic == topic and r.partition == partition and r.start <= offset < r.end for r in cp.ranges
            ):
                return cp if cp.state is CheckpointState.PLANNED else None
            if not self._advance(n):
                return None
        return None

    def _fault_oversize_dead_letter(self, n: int) -> str | None:
        """One source record whose dead letter is larger than the dead-letter topic takes
        (``max.message.bytes`` lowered to ``DLQ_MAX_MESSAGE_BYTES``): a poison record (the
        transform fails on it) a little over that limit, or a record over the sink's limit
        (its output too large: the whole source record is the dead letter). The prepare must
        refuse it, naming the record's source position and the limit, the checkpoint still
        PLANNED; once the topic's limit is raised, the next run-once goes on and the record
        is one dead letter (in the sink never)."""
        assert self.pipeline is not None and self.ledger is not None and self.feeder is not None
        dlq = self.pipeline.dead_letter_topic
        assert dlq is not None
        self._set_max_message_bytes(dlq, DLQ_MAX_MESSAGE_BYTES)
        repaired = False
        try:
            poison = self.rng.random() < 0.5
            if poison:
                size = self.rng.randint(DLQ_MAX_MESSAGE_BYTES + 1024, 2 * DLQ_MAX_MESSAGE_BYTES)
                head = f"POISON:{self.feeder.tag}:dl{n}:".encode()
            else:
                size = self.rng.randint(MAX_MESSAGE_BYTES + 4096, 2 * MAX_MESSAGE_BYTES)
                head = f"{self.feeder.tag}:dl{n}:big:".encode()
            value = head + b"D" * (size - len(head))
            position = self._inject(value)
            what = f"{'poison' if poison else 'over the sink limit'} {size} B at {position}"
            cp = self._planned_over(n, position)
            if cp is None:
                self.log(f"  no PLANNED checkpoint reached {position}; the limit goes back up")
                return None
            cid = cp.checkpoint_id
            code, text = self._prepare_for_check(n, cid)
            state = self._state_of(cid)
            digits = text.replace(",", "").replace("_", "")
            topic, partition, offset = position
            named = (
                topic in text
                and str(offset) in digits
                and str(partition) in digits
                and str(DLQ_MAX_MESSAGE_BYTES) in digits
            )
            wedged = ""
            if code == 0 or state is not CheckpointState.PLANNED or not named or "Traceback" in text:
                if state is CheckpointState.PREPARED:
                    # What its commit does with the dead letter the topic refuses.
                    wedge_log = f"cycle-{n:04d}-wedge.log"
                    self._spawn(n, log_name=wedge_log)
                    wedged = f"; its commit: exit {self._reap()}: {self._child_text(wedge_log)[-300:]}"
                self._violation(
                    f"prepare of checkpoint {cid} with a dead letter over the dead-letter topic's "
                    f"max.message.bytes={DLQ_MAX_MESSAGE_BYTES} ({what}): exit {code}, now "
                    f"{state.value} (must be refused naming the position and limit, still PLANNED): "
                    f"{text[-400:]}{wedged}"
                )
            self._set_max_message_bytes(dlq, DLQ_REPAIRED_BYTES)
            repaired = True
            self._spawn(n)
            code_next = self._reap()
            now = self._state_of(cid)
            if code_next != 0 or now is not CheckpointState.COMMITTED:
                text_next = self._child_text(f"cycle-{n:04d}.log")
                self._violation(
                    f"run-once after raising {dlq}'s max.message.bytes to {DLQ_REPAIRED_BYTES}: "
                    f"exit {code_next}, checkpoint {cid} {now.value}: {text_next[-300:]}"
                )
                if now is CheckpointState.PREPARED:
                    # Wedged for good (the producer sized from the sink alone): let it through
                    # by raising the sink's limit for one run, so that the run can go on.
                    sink = self.pipeline.sink_topic
                    self._set_max_message_bytes(sink, DLQ_REPAIRED_BYTES)
                    try:
                        self._spawn(n, log_name=f"cycle-{n:04d}-unwedge.log")
                        self.log(f"  sink limit raised for one run: exit {self._reap()}")
                    finally:
                        self._set_max_message_bytes(sink, MAX_MESSAGE_BYTES)
            digest = _digest(value)
            dead = sum(1 for m in self._dead_letters() if _digest(m.value()) == digest)
            published = sum(
                1 for m in read_sink(self.config, self.pipeline.sink_topic) if _digest(m.value()) == digest
            )
            if (dead, published) != (1, 0) and self._state_of(cid) is CheckpointState.COMMITTED:
                self._violation(
                    f"the record {what} of checkpoint {cid}: {dead} dead letters, {published} in the "
                    "sink (must be 1 and 0)"
                )
            return (
                f"{what}: prepare of {cid} exit {code} ({state.value}{', named' if named else ''}); "
                f"limit raised, run-once exit {code_next} ({now.value}); {dead} dead letter(s)"
            )
        finally:
            if not repaired:
                self._set_max_message_bytes(dlq, DLQ_REPAIRED_BYTES)

    def _prepare_for_check(self, n: int, checkpoint_id: int) -> tuple[int, str]:
        """Prepare ``checkpoint_id`` (here with ``--prepare mixed``, else an ``eo prepare``
        child): (0 or 1 here / the child's exit, the error's or the child's text)."""
        assert self.pipeline is not None and self.ledger is not None
        if self.spark is None:
            name = f"cycle-{n:04d}-prepare.log"
            self._spawn(n, args=("prepare", REF), log_name=name)
            return self._reap() or 0, self._child_text(name)
        from airflow_provider_eo.core.prepare import prepare_checkpoint
        from airflow_provider_eo.errors import EoError
        from airflow_provider_eo.spark.stager import SparkStager

        try:
            prepare_checkpoint(self.pipeline, self.ledger, checkpoint_id, stager=SparkStager(self.spark))
        except EoError as exc:
            return 1, " ".join(f"{type(exc).__name__}: {exc}".split())
        except Exception as exc:  # not one of eo's errors: a crash, not a refusal
            return 1, " ".join(f"Traceback (not an EoError) {type(exc).__name__}: {exc}".split())
        return 0, ""

    # -- a spark-mode commit's lease lapsing, the sink's query restarted elsewhere ----------------
    def _fault_spark_lease_lapse(self, n: int) -> str | None:
        """``eo commit --commit-mode spark`` of checkpoint N, its first shard's Spark task held
        before its shard began (``EO_FAULT=commit.task_start``, ``zombie``: a task queued
        behind others, a slow executor), its driver then stopped (SIGSTOP) until the commit
        lease lapses. Another process acts on the lapsed lease: ``eo abort N`` (nothing was
        published: it must abort) or another committer (``eo run-once``: it must commit N).
        Then the driver is killed or resumed (its lease keeper finds the lease gone and
        cancels its jobs: it must not exit 0), and the held task goes on, its
        ``init_transactions`` after the other's fence: it must publish nothing (the abort's
        mark, or the marker of the commit). The next run-once publishes nothing twice."""
        assert self.pipeline is not None and self.ledger is not None
        cp = self._prepared(n)
        if cp is not None and cp.shards:  # a commit of it began before: finish it first
            self._advance(n)
            if self.spark is not None:
                self._prepare_here()
            cp = self._prepared(n)
        if cp is None or cp.commit_plan is None or cp.shards:
            return None  # a PREPARED checkpoint, no commit of it begun
        cid = cp.checkpoint_id
        before = self._quiet_sink_ends()
        flag = self.work / f"cycle-{n:04d}-task"
        log_name = f"cycle-{n:04d}-spark.log"
        driver = self._spawn(
            n,
            fault="commit.task_start",
            action="zombie",
            once=flag,
            args=("commit", REF, "--commit-mode", "spark", "--json"),
            log_name=log_name,
        )
        task: int | None = None
        try:
            pid_file = Path(f"{flag}.pid")

            def held() -> bool:
                text = pid_file.read_text().strip() if pid_file.exists() else ""
                return bool(text) and _process_state(int(text)) == "T"

            if not self._wait(held, 300):
                self.log(f"  no commit task held: {self._child_text(log_name)[-300:]}")
                return None
            task = int(pid_file.read_text())
            # The driver (eo and its Spark JVM; the held task left its process group) stops
            # renewing: its lease lapses, the driver alive but silent.
            self._signal(signal.SIGSTOP)
            stopped = time.monotonic()
            self._lease_run_out(cid)
            lapsed = time.monotonic() - stopped
            self.child = None  # the driver stays stopped while another process acts
            how = self.rng.choice(("abort", "commit"))
            if how == "abort":
                code, text = self._call(
                    n, "abort", [EO, "abort", REF, str(cid), "--reason", "torture: spark-mode lease lapsed"]
                )
                state = self._state_of(cid)
                if code != 0 or state is not CheckpointState.ABORTED or "Traceback" in text:
                    self._violation(
                        f"abort of checkpoint {cid} after its spark-mode committer's lease lapsed, "
                        f"nothing published: exit {code}, now {state.value} (must be ABORTED): "
                        f"{text[-300:]}"
                    )
                self._check_sink_unchanged(before, f"abort of checkpoint {cid} (lease lapsed)")
            else:
                second = f"cycle-{n:04d}-second.log"
                self._spawn(n, log_name=second)
                code = self._reap() or 0
                state = self._state_of(cid)
                if code != 0 or state is not CheckpointState.COMMITTED:
                    self._violation(
                        f"run-once after checkpoint {cid}'s spark-mode committer's lease lapsed: exit "
                        f"{code}, now {state.value} (must be COMMITTED): {self._child_text(second)[-300:]}"
                    )
            after = self._quiet_sink_ends()
            resume = self.rng.random() < 0.5
            if resume:
                # Its lease keeper renews at once, finds the lease taken, cancels the
                # checkpoint's jobs (the held task with them, or it goes on below).
                os.killpg(driver.pid, signal.SIGCONT)
            else:
                os.killpg(driver.pid, signal.SIGKILL)
            self.child = driver
            code_driver = self._reap(timeout_s=180)
            driver_text = self._child_text(log_name)
            if resume and code_driver == 0:
                self._violation(
                    f"the spark-mode driver of checkpoint {cid}, resumed after {how} took its lapsed "
                    f"lease, exited 0: {driver_text[-300:]}"
                )
            gone = _process_state(task) in ("", "Z")
            ended = _resume_and_reap(task)
            task = None
            found = len(self.violations)
            self._check_sink_unchanged(
                after, f"the held commit task of checkpoint {cid}, going on after the {how}"
            )
            unchanged = "sink unchanged" if len(self.violations) == found else "THE SINK MOVED"
            code_next = None
            if how == "abort":
                self._spawn(n)
                code_next = self._reap()
            twice = self._duplicated_since(before)
            if twice:
                self._violation(
                    f"checkpoint {cid} ({how} after its lease lapsed): {twice} sink records twice"
                )
            lost = "gave up its commit lease" in driver_text
            return (
                f"checkpoint {cid}: task held, driver stopped, lease lapsed after {lapsed:.0f}s; {how} "
                f"exit {code} ({state.value}); driver {'resumed' if resume else 'killed'}: exit "
                f"{code_driver}{', lease given up' if lost else ''}; held task "
                f"{'cancelled with its job' if gone else 'went on'}{'' if ended else ' (SIGKILLed)'}, "
                f"{unchanged}; next run-once exit {code_next}, {twice} published twice"
            )
        finally:
            if driver.poll() is None:  # an early return or an error: the driver goes
                self.child = driver
                self._signal(signal.SIGCONT)
                self._signal(signal.SIGKILL)
                self._reap()
            if task is not None:
                _resume_and_reap(task)

    def _ss_session(self) -> Any:
        """The SparkSession the Structured Streaming query runs in: the run's own, else one
        started for it (``--prepare child``)."""
        if self.spark is not None:
            return self.spark
        if self._ss_spark is None:
            from airflow_provider_eo.spark.session import get_spark

            self._ss_spark = get_spark("eo-torture-ss")
        return self._ss_spark

    def _ss_query(self) -> SsQuery:
        """ss_new_location's query, made on first use (its sink topic, ledger and first
        checkpoint location)."""
        if self.ss is None:
            sink = f"torture-ss-{self.seed}"
            admin.ensure_topic(
                self.config,
                sink,
                partitions=self.sink_partitions,
                topic_config={"max.message.bytes": str(SS_SINK_MAX_MESSAGE_BYTES)},
            )
            root = self.work / "ss"
            root.mkdir(parents=True, exist_ok=True)
            self.ss = SsQuery(
                name=f"torture-ss-{self.seed}-{uuid.uuid4().hex[:6]}",
                sink_topic=sink,
                ledger_url=f"sqlite:///{root / 'ledger.db'}",
                staging_dir=str(root / "staging"),
                root=root,
            )
        return self.ss

    def _ss_sink(self, allow_new_query: bool = False) -> Any:
        from airflow_provider_eo.streaming import KafkaExactlyOnceSink

        q = self._ss_query()
        return KafkaExactlyOnceSink(
            name=q.name,
            kafka=dict(self.config),
            sink_topic=q.sink_topic,
            ledger_url=q.ledger_url,
            staging_dir=q.staging_dir,
            commit_shards=2,
            commit_mode="local",
            transaction_timeout_ms=self.transaction_timeout_ms,
            allow_new_query=allow_new_query,
            heartbeat_s=1.0,
        )

    def _ss_run(
        self,
        location: str,
        *,
        allow_new_query: bool = False,
        starting: str = "earliest",
        timeout_s: int = 300,
    ) -> tuple[str | None, str, int]:
        """Run the query from ``location`` (``availableNow``: what the source holds now, in
        micro-batches): (None, or the text of the error it ended with; its query id; the
        input rows of its batches)."""
        from pyspark.errors import StreamingQueryException

        assert self.pipeline is not None
        spark = self._ss_session()
        sink = self._ss_sink(allow_new_query)
        frame = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.config["bootstrap.servers"])
            .option("subscribe", self.pipeline.source_topics[0])
            .option("startingOffsets", starting)
            # Records of aborted source transactions are no input (as for the pipeline's reads).
            .option("kafka.isolation.level", "read_committed")
            .option("maxOffsetsPerTrigger", SS_MAX_OFFSETS)
            .load()
            .select("key", "value")
        )
        error: str | None = None
        query: Any = None
        try:
            query = sink.start(frame, location, output_mode="append", available_now=True)
            if not query.awaitTermination(timeout_s):
                query.stop()
                error = f"still running after {timeout_s}s (stopped)"
        except StreamingQueryException as exc:
            error = " ".join(str(exc).split())
        except Exception as exc:  # the start refused: the text says why
            error = f"{type(exc).__name__}: " + " ".join(str(exc).split())
        finally:
            try:
                sink.close()
            except Exception as exc:  # the run's end in the ledger: not the query's outcome
                self.log(f"  sink.close(): {type(exc).__name__}: {str(exc)[:200]}")
        if query is None:
            return error, "", 0
        rows = sum(int(p.get("numInputRows", 0) or 0) for p in query.recentProgress)
        return error, str(query.id), rows

    def _ss_newest(self) -> Any:
        """The query's newest live batch checkpoint (None before its first)."""
        from airflow_provider_eo.core.batches import newest_checkpoint

        q = self._ss_query()
        with Ledger(q.ledger_url) as ledger:
            try:
                return newest_checkpoint(ledger, q.name)
            except Exception:  # not registered yet
                return None

    def _ss_wrote(self, query_id: str) -> bool:
        """The query's newest batch is one of query ``query_id``."""
        now = self._ss_newest()
        return now is not None and now.query_id == query_id

    def _ss_ends(self) -> dict[tuple[str, int], int]:
        """The query's sink high watermarks."""
        q = self._ss_query()
        return high_watermarks(self.config, [(q.sink_topic, p) for p in range(self.sink_partitions)])

    def _ss_values(self) -> Counter[bytes]:
        return Counter(_digest(m.value()) for m in read_sink(self.config, self._ss_query().sink_topic))

    def _ss_check_unchanged(self, before: dict[tuple[str, int], int], what: str) -> None:
        after = self._ss_ends()
        if after != before:
            moved = {p: (before.get((t, p)), o) for (t, p), o in after.items() if before.get((t, p)) != o}
            self._violation(f"{what}: the query's sink moved {moved}")

    def _ss_fresh_location(self) -> str:
        q = self._ss_query()
        q.locations += 1
        return str(q.root / f"ckpt-{q.locations}")

    def _fault_ss_new_location(self, n: int) -> str | None:
        """A Structured Streaming query through ``KafkaExactlyOnceSink`` (identity over the
        run's source into a sink topic of its own) runs from its checkpoint location, then
        starts again from a NEW location (a new query id, batch ids from 0). Without
        ``allow_new_query`` it must be refused (QueryIdentityMismatch, "another checkpoint
        location"), nothing published, and the old location goes on. With it, from the
        source's earliest or latest offsets, or from the old query's ends: refused unless it
        starts at those ends (the refusal names them; a start there, at another new location,
        continues the pipeline). Never a duplicate (checked here) or a loss (the audit)."""
        q = self._ss_query()
        error, _qid, _rows = self._ss_run(q.location)
        newest = self._ss_newest()
        if error is not None or newest is None:
            self.log(f"  the query from {q.location}: {_why(error) if error else 'no batch'}")
            return None
        first_cid = newest.checkpoint_id
        before = self._ss_ends()
        new = self._ss_fresh_location()
        allow = self.rng.random() < 0.5
        if not allow:
            error, qid, rows = self._ss_run(new)
            refused = (
                error is not None
                and "QueryIdentityMismatch" in error
                and "another checkpoint location" in error
            )
            if not refused:
                self._violation(
                    f"query started again from the new location {new} without allow_new_query: "
                    f"{'not refused' if error is None else 'failed otherwise: ' + _why(error)}"
                )
            self._ss_check_unchanged(before, f"query from the new location {new}, refused")
            resumed = self._ss_run(q.location)[0]
            if resumed is not None:
                self._violation(f"the query from its old location after the refusal: {_why(resumed)}")
            what = f"without allow_new_query: {'refused' if refused else 'NOT refused'}; old location went on"
        else:
            starting = self.rng.choice(("earliest", "latest", "ends"))
            ends: dict[str, dict[str, int]] = {}
            for r in newest.ranges:
                ends.setdefault(r.topic, {})[str(r.partition)] = r.end
            spec = json.dumps(ends) if starting == "ends" else starting
            assert self.pipeline is not None
            source = [(self.pipeline.source_topics[0], p) for p in range(self.source_partitions)]
            at_start = admin.list_offsets(self.config, source, spec="latest")
            error, qid, rows = self._ss_run(new, allow_new_query=True, starting=spec)
            outcome = "continued"
            if error is None and starting == "latest" and not self._ss_wrote(qid):
                # No batch: "latest" was the source's end when it started, and the location
                # keeps that start. Once the source has moved on, its first batch starts there
                # (past the old query's ends when records came in between).
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and all(
                    o <= at_start.get(tp, 0)
                    for tp, o in admin.list_offsets(self.config, source, spec="latest").items()
                ):
                    time.sleep(0.5)
                error, qid, rows = self._ss_run(new, allow_new_query=True, starting=spec)
                outcome = "no batch at first, run again"
            if error is not None:
                self._ss_check_unchanged(before, f"new query ({starting}) at {new}, refused")
                found = re.search(r"startingOffsets=(\{.*?\}\})", error)
                if "QueryIdentityMismatch" not in error or found is None or starting == "ends":
                    self._violation(
                        f"new query with allow_new_query from {starting} at {new}: {_why(error)} "
                        "(must continue from the old query's ends, or be refused naming them)"
                    )
                    found = None
                if found is not None:
                    new = self._ss_fresh_location()  # the refused one's offset log holds its start
                    error, qid, rows = self._ss_run(new, allow_new_query=True, starting=found.group(1))
                    outcome = (
                        f"{'' if outcome == 'continued' else outcome + '; '}refused, then from "
                        f"{found.group(1)}: {'continued' if error is None else 'failed'}"
                    )
                    if error is not None:
                        self._violation(f"new query from the refusal's startingOffsets: {_why(error)}")
                else:
                    outcome = "failed"
            elif starting == "earliest" and self._ss_wrote(qid):
                self._violation(f"new query from the earliest offsets at {new} was not refused")
            if error is None and rows and not self._ss_wrote(qid):
                # Input read, nothing refused, no batch of it recorded: skipped as if published.
                self._violation(
                    f"new query ({starting}) at {new} read {rows} records in batches neither refused "
                    "nor recorded: skipped unpublished"
                )
            if error is None and self._ss_wrote(qid):
                q.location = new  # the new query continues the pipeline
            else:
                outcome += "; old location goes on"
                if (resumed := self._ss_run(q.location)[0]) is not None:
                    self._violation(f"the query from its old location after the new one: {_why(resumed)}")
            what = f"allow_new_query from {starting}: {outcome}"
        counts = self._ss_values()
        twice = sum(c - 1 for c in counts.values() if c > 1)
        if twice:
            self._violation(f"the query's sink holds {twice} records more than once after a new location")
        last = self._ss_newest()
        return (
            f"{what}; batches {first_cid} -> {last.checkpoint_id if last else None}, "
            f"{sum(counts.values())} in its sink, {twice} twice"
        )

    def ss_catch_up(self, max_runs: int = 5) -> None:
        """Run ss_new_location's query (when it ran) until its batches reach the source's ends."""
        if self.ss is None:
            return
        assert self.pipeline is not None
        source = [(self.pipeline.source_topics[0], p) for p in range(self.source_partitions)]
        ends = admin.list_offsets(self.config, source, spec="latest")
        for i in range(max_runs):
            error, _qid, _rows = self._ss_run(self.ss.location)
            newest = self._ss_newest()
            heads = {(r.topic, r.partition): r.end for r in newest.ranges} if newest is not None else {}
            behind = {tp: (heads.get(tp), e) for tp, e in ends.items() if heads.get(tp, 0) < e}
            if error is None and not behind:
                self.log(f"the Structured Streaming query caught up after {i + 1} run(s)")
                return
            self.log(f"query catch-up run {i}: {_why(error) if error else 'ok'}; behind {behind}")
        self._violation(f"the Structured Streaming query did not catch up in {max_runs} runs")

    def ss_audit(self, result: Result, committed: Counter[bytes]) -> None:
        """Count the query's sink against the committed source records, by value and with
        ``eo audit``'s source-based auditor."""
        from airflow_provider_eo.core.audit import audit_pipeline

        if self.ss is None:
            return
        out = self._ss_values()
        extra, lost = out - committed, committed - out
        report = None
        sink = self._ss_sink()
        try:
            with Ledger(self.ss.ledger_url) as ledger:
                report = audit_pipeline(sink.as_pipeline(), ledger)
        except Exception as exc:
            self.log(f"the query's audit failed: {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            sink.close()
        audit = report.as_dict() if report is not None else {}
        # Its output names no source positions (a query's state may aggregate them), so `eo
        # audit` checks its batches against what they staged; against the source it is
        # counted by value here.
        result.ss = {
            "records": sum(committed.values()),
            "out": sum(out.values()),
            "dup": max(
                sum(extra.values()), int(audit.get("duplicates", 0)) + int(audit.get("unexpected", 0))
            ),
            "miss": max(sum(lost.values()), int(audit.get("missing", 0))),
            "audit_ok": bool(audit.get("ok")) and audit.get("source_expired", 0) == 0,
            "locations": self.ss.locations,
        }
        result.duplicates += result.ss["dup"]
        result.missing += result.ss["miss"]
        self.log(f"the query's audit: {result.ss}")

    # -- catch-up and audit ------------------------------------------------------------------
    def catch_up(self, max_runs: int = 200) -> None:
        """Stop the feeder; run-once until nothing is unfinished and every source partition
        is consumed to its last stable offset."""
        from airflow_provider_eo.core.runner import run_once
        from airflow_provider_eo.spark.stager import SparkStager

        assert self.feeder is not None and self.pipeline is not None and self.ledger is not None
        self.feeder.stop()
        self.log(
            f"feeder stopped: {self.feeder.seq} records sent by {self.feeder.generation + 1} "
            f"generation(s), batches {dict(self.feeder.batches)}, {len(self.feeder.crashes)} crashed"
        )
        source = [(self.pipeline.source_topics[0], p) for p in range(self.source_partitions)]
        config = self.config
        for i in range(max_runs):
            try:
                if self.spark is not None:
                    r = run_once(self.pipeline, ledger=self.ledger, stager=SparkStager(self.spark))
                    steps = r.steps
                else:
                    self._spawn(10_000 + i)
                    code = self._reap()
                    steps = [f"exit {code}"]
            except Exception as exc:
                self.log(f"catch-up run {i}: {type(exc).__name__}: {str(exc)[:300]}")
                time.sleep(1.0)  # a retry, as a task retry would, not a synchronisation
                continue
            ends = admin.list_offsets(config, source, spec="latest")
            heads = self.ledger.next_starts(self.pipeline.name)
            behind = {tp: (heads.get(tp), end) for tp, end in ends.items() if heads.get(tp, 0) < end}
            if self._unfinished() is None and not behind:
                self.log(f"caught up after {i + 1} run(s)")
                return
            if i % 10 == 0:
                self.log(f"catch-up run {i}: {steps}; behind {behind}")
        raise RuntimeError(f"torture: the pipeline did not catch up in {max_runs} runs")

    def audit(self, result: Result) -> None:
        from airflow_provider_eo.core.audit import audit_pipeline

        assert self.pipeline is not None and self.ledger is not None
        config = self.config
        topic = self.pipeline.source_topics[0]
        committed = Counter(_digest(m.value()) for m in read_sink(config, topic))
        everything = Counter(_digest(m.value()) for m in read_uncommitted(config, topic))
        aborted = everything - committed
        sink = Counter(_digest(m.value()) for m in read_sink(config, self.pipeline.sink_topic))
        # A dead letter is its source record's value as it was: a source record is accounted
        # for once when it is in the sink or on the dead-letter topic, never both.
        dead = Counter(_digest(m.value()) for m in self._dead_letters())
        out = sink + dead
        result.records_in = sum(committed.values())
        result.aborted_in = sum(aborted.values())
        result.records_out = sum(sink.values())
        result.dead_letters_out = sum(dead.values())
        extra = out - committed  # duplicates, and anything never committed at the source
        lost = committed - out
        leaked = sum(n for v, n in extra.items() if v in aborted)
        report = audit_pipeline(self.pipeline, self.ledger)
        result.audit = report.as_dict()
        result.audit.pop("checkpoints", None)
        result.audit["aborted_input_leaked"] = leaked
        result.value_duplicates, result.value_missing = sum(extra.values()), sum(lost.values())
        result.duplicates = max(result.value_duplicates, report.duplicates + report.unexpected)
        result.missing = max(result.value_missing, report.missing)
        self.ss_audit(result, committed)
        # Group offsets: the last committed ends (no checkpoint is unfinished after catch-up).
        source = [(topic, p) for p in range(self.source_partitions)]
        heads = {tp: o for tp, o in self.ledger.next_starts(self.pipeline.name).items() if tp in source}
        group = admin.committed_group_offsets(config, self.pipeline.group_id, source)
        result.group_offsets_ok = bool(heads) and group == heads
        if not result.group_offsets_ok:
            self.log(f"group offsets {group} != ledger ends {heads}")


def run(
    cycles: int,
    seed: int,
    *,
    spark: Any = None,
    work_dir: Path | None = None,
    pg_dir: Path | None = None,
    source_partitions: int = 4,
    sink_partitions: int = 3,
    commit_shards: int = 2,
    max_records: int = 400,
    transaction_timeout_ms: int = 10_000,
    rate: float = 40.0,
    kinds: Sequence[str] = KINDS,
    log: Callable[[str], None] = _stderr,
) -> Result:
    """Run ``cycles`` chaos cycles with ``seed``, catch up, audit; see the module doc.

    :param spark: a SparkSession to prepare in (``--prepare mixed``); ``None`` lets every
        ``eo run-once`` child prepare by itself.
    :param work_dir: folder for the broker, staging and per-cycle child logs (kept when the
        run is not ok; default ``<repo>/.eo/torture/<id>``).
    :param pg_dir: PostgreSQL state folder (default: ``scripts/postgres.sh`` cluster
        ``torture``, a sibling of the default one): a cluster of its own, since the run stops it.
    :param rate: feeder records per second (on average).
    :param kinds: the fault kinds to draw from (all by default; a subset proves one kind's
        checks quickly).
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; choose from {KINDS}")
    weights = [WEIGHTS[KINDS.index(k)] for k in kinds]
    started = time.monotonic()
    work = work_dir or ROOT / ".eo" / "torture" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True, exist_ok=True)
    pg = pg_dir
    result = Result(seed=seed, cycles=cycles)

    def note(msg: str) -> None:
        result.log.append(msg)
        log(msg)

    t = Torture(
        seed=seed,
        work=work,
        pg_dir=pg,
        spark=spark,
        source_partitions=source_partitions,
        sink_partitions=sink_partitions,
        commit_shards=commit_shards,
        max_records=max_records,
        transaction_timeout_ms=transaction_timeout_ms,
        rate=rate,
        log=note,
    )
    try:
        t.up()
        todo = list(kinds)  # every kind is injected once before the weighted draws
        t.rng.shuffle(todo)
        for n in range(1, cycles + 1):
            kind = todo[0] if todo else t.rng.choices(list(kinds), weights=weights)[0]
            assert t.feeder is not None
            t.feeder.ensure()  # a feeder that crashed (the bench's client) is started again
            before = t._unfinished()
            cycle_started = time.monotonic()
            injected, code = t.cycle(n, kind)
            if code != 0:
                result.failed_runs += 1
            if injected is None:
                result.missed += 1
            else:
                if kind in todo:
                    todo.remove(kind)
                result.kinds[kind] += 1
                result.faults += kind != "none"
            at = f"checkpoint {before.checkpoint_id} {before.state.value}" if before else "no unfinished"
            note(
                f"cycle {n}/{cycles} {kind}: {injected or 'missed'}; exit {code}; {at} before; "
                f"{time.monotonic() - cycle_started:.1f}s"
            )
        t.catch_up()
        t.ss_catch_up()
        t.audit(result)
    finally:
        result.seconds = time.monotonic() - started
        result.violations = list(t.violations)
        result.misrefused = list(t.misrefused)
        t.down()
        result.bench_crashes = list(t.feeder.crashes) if t.feeder is not None else []
    note(f"audit: {result.audit}; in-aborted={result.aborted_in} failed_runs={result.failed_runs}")
    for v in result.violations:
        note(f"violation: {v}")
    for v in result.misrefused:
        note(f"misrefused: {v}")
    for v in result.bench_crashes:
        note(f"bench client crash (not counted): {v}")
    note(f"{result.seconds:.0f}s, work folder {work}")
    if result.ok:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prepare", choices=("mixed", "child"), default="mixed")
    ap.add_argument("--rate", type=float, default=40.0, help="feeder records per second")
    ap.add_argument("--max-records", type=int, default=400, help="the pipeline's max_records_per_checkpoint")
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated fault kinds to draw from (default: all)"
    )
    # The feeder child (FeederProcess starts it): produce into --topic until SIGTERM.
    ap.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    ap.add_argument("--transactional-id", help=argparse.SUPPRESS)
    ap.add_argument("--generation", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.feed:
        return feed_main(args)
    # A terminated run still stops its broker and PostgreSQL (the finally in run()).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    kinds = [k for k in args.kinds.split(",") if k]
    spark = None
    if args.prepare == "mixed":
        from airflow_provider_eo.spark.session import get_spark

        spark = get_spark("eo-torture")
    try:
        result = run(
            args.cycles,
            args.seed,
            spark=spark,
            rate=args.rate,
            max_records=args.max_records,
            kinds=kinds,
        )
    finally:
        if spark is not None:
            spark.stop()
    print(result.line(), flush=True)
    gaps = result.gaps(kinds) if args.cycles >= len(kinds) else []
    for gap in gaps:
        print(f"torture: {gap}", file=sys.stderr, flush=True)
    return 0 if result.ok and not gaps else 1


if __name__ == "__main__":
    sys.exit(main())
