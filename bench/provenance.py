"""The produce cost of the ``eo.prov`` provenance header.

Usage: .venv/bin/python bench/provenance.py [--records N] [--rounds R] [--partitions P]

Starts its own broker (stopped at the end, a terminated run included), builds staged-like
Arrow batches (~10-byte keys, ~90-byte values, source columns, no user headers) and
publishes them, N records over P sink partitions per round, in one Kafka transaction
through a fresh transactional producer, once per variant, the variants' order rotated
every round:

- ``plain``: the commit's produce loop with no header at all (the reference);
- ``staged``: the real ``produce_staged`` (the compact header, passed positionally);
- ``text_kw``: the loop before: the text value, ``headers=`` passed by keyword;
- ``text_pos``: the text value, headers passed positionally (the Python loop);
- ``compact_kw`` / ``compact_pos``: the compact binary value, by keyword / positionally
  (the Python loop);
- ``tiny_pos``: a 1-byte header value, positional: the floor for any encoding of one header.

The Python produce loop and the flush (+ commit) are timed separately, and the process's
CPU time (the Python thread and librdkafka's, less disturbed by a busy machine than the
wall clock); medians over the rounds. Then a profile without the broker's part: the same
``produce()`` calls into a producer that never sends (long linger, purged), per record,
min over the rounds, and the header's bytes per record on the wire. The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from airflow_provider_eo import names  # noqa: E402
from airflow_provider_eo.kafka import publisher  # noqa: E402

BATCH_ROWS = 8192  # what staging.iter_batches yields
PIPELINE = "bench"
IDENTITY = "0123456789abcdef0123456789abcdef"
CHECKPOINT_ID = 123
SOURCE_TOPIC = "orders-src"
Loop = Callable[[Producer, str, int, Iterable[pa.RecordBatch], bytes], int]


def log(msg: str) -> None:
    print(f"[provenance {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def staged_batches(records: int, first_offset: int) -> list[pa.RecordBatch]:
    """Staged-like batches: the staged schema (key, value, headers, source columns)."""
    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("src_topic", pa.string()),
            ("src_partition", pa.int32()),
            ("src_offset", pa.int64()),
        ]
    )
    pad = b"x" * 60
    out = []
    for start in range(0, records, BATCH_ROWS):
        n = min(BATCH_ROWS, records - start)
        seq = range(first_offset + start, first_offset + start + n)
        out.append(
            pa.record_batch(
                [
                    pa.array([b"user-%05d" % (i % 9973) for i in seq], pa.binary()),
                    pa.array([b'{"seq":%09d,"pad":"%s","more":"xxxx"}' % (i, pad) for i in seq], pa.binary()),
                    pa.nulls(n, schema.field("headers").type),
                    pa.array([SOURCE_TOPIC] * n, pa.string()),
                    pa.array(np.full(n, 3, dtype=np.int32)),
                    pa.array(np.arange(first_offset + start, first_offset + start + n, dtype=np.int64)),
                ],
                schema=schema,
            )
        )
    return out


# -- the variants: the commit's loop (no user headers here), one way each ---------------------


def loop_plain(
    producer: Producer, topic: str, partition: int, batches: Iterable[pa.RecordBatch], _h: bytes
) -> int:
    send = producer.produce
    count = 0
    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for i in range(batch.num_rows):
            try:
                send(topic, values[i], keys[i], partition)
            except BufferError:
                publisher.serve("poll", producer.poll, 0.05)
                publisher.produce(producer, topic, value=values[i], key=keys[i], partition=partition)
        count += batch.num_rows
        producer.poll(0)
    return count


def text_values(batch: pa.RecordBatch, checkpoint_field: bytes, partition: int, index: int) -> list[bytes]:
    """The text value (``pipeline:checkpoint:identity8 partition:index topic:partition:offset``)."""
    prefix = f"{checkpoint_field.decode()} {partition}:"
    return publisher.provenance_values(batch, prefix, index).to_pylist()


def compact_values(batch: pa.RecordBatch, checkpoint_field: bytes, partition: int, index: int) -> list[bytes]:
    """The compact value (``names.compact_provenance``)."""
    return publisher.compact_provenance_values(
        batch, names.compact_provenance_prefix(checkpoint_field, partition), index
    )


def _loop(values_of: Callable[[pa.RecordBatch, bytes, int, int], list[bytes]], positional: bool) -> Loop:
    """The commit's loop with one header per record: its value from ``values_of``, passed by
    keyword (``headers=``, as the loop did before) or positionally."""

    def loop(
        producer: Producer, topic: str, partition: int, batches: Iterable[pa.RecordBatch], h: bytes
    ) -> int:
        send = producer.produce
        key_name = names.HEADER_PROVENANCE
        index = 0
        for batch in batches:
            n = batch.num_rows
            prov = values_of(batch, h, partition, index)
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            for i in range(n):
                hdrs = [(key_name, prov[i])]
                try:
                    if positional:
                        send(topic, values[i], keys[i], partition, None, None, 0, hdrs)
                    else:
                        send(topic, values[i], keys[i], partition, headers=hdrs)
                except BufferError:
                    publisher.serve("poll", producer.poll, 0.05)
                    publisher.produce(
                        producer, topic, value=values[i], key=keys[i], partition=partition, headers=hdrs
                    )
            index += n
            producer.poll(0)
        return index

    return loop


def tiny_values(batch: pa.RecordBatch, _h: bytes, _p: int, _i: int) -> list[bytes]:
    return [b"x"] * batch.num_rows


def loop_staged(
    producer: Producer, topic: str, partition: int, batches: Iterable[pa.RecordBatch], h: bytes
) -> int:
    return publisher.produce_staged(producer, topic, partition, batches, h)


VARIANTS: dict[str, Loop] = {
    "plain": loop_plain,
    "staged": loop_staged,
    "text_kw": _loop(text_values, positional=False),
    "text_pos": _loop(text_values, positional=True),
    "compact_kw": _loop(compact_values, positional=False),
    "compact_pos": _loop(compact_values, positional=True),
    "tiny_pos": _loop(tiny_values, positional=True),
}


# -- the transactional rounds -----------------------------------------------------------------


def one_round(
    bootstrap: str, topic: str, loop: Loop, parts: dict[int, list[pa.RecordBatch]], header: bytes
) -> tuple[float, float, float]:
    """(produce loop s, flush + commit s, CPU s of this process meanwhile: the Python thread
    and librdkafka's) of one transaction through a fresh producer."""
    producer = publisher.new_producer(
        {"bootstrap.servers": bootstrap},
        f"bench-prov-{uuid.uuid4().hex[:8]}",
        120_000,
        publisher.DeliveryFailures(),
    )
    publisher.connect(producer, topic, 15)
    producer.init_transactions(30)
    producer.begin_transaction()
    cpu = time.process_time()
    started = time.perf_counter()
    for partition, batches in parts.items():
        loop(producer, topic, partition, batches, header)
    looped = time.perf_counter()
    remaining = producer.flush(120)
    producer.commit_transaction(60)
    done = time.perf_counter()
    cpu = time.process_time() - cpu
    if remaining:
        raise SystemExit(f"flush left {remaining} records unsent")
    return looped - started, done - looped, cpu


# -- the profile: produce() alone, never sent --------------------------------------------------


def profile(bootstrap: str, topic: str, batch: pa.RecordBatch, rounds: int) -> dict[str, float]:
    """ns per record of each piece of the per-record work, min over ``rounds``."""
    n = batch.num_rows
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    field = names.provenance_checkpoint_field(PIPELINE, CHECKPOINT_ID, IDENTITY).encode()
    text = text_values(batch, field, 0, 0)
    half = [(v[: len(v) // 2], v[len(v) // 2 :]) for v in text]
    key_name = names.HEADER_PROVENANCE
    current = publisher.compact_provenance_values(batch, names.compact_provenance_prefix(field, 0), 0)

    def never_sent() -> Producer:
        return Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 300_000,
                "message.timeout.ms": 600_000,
                "queue.buffering.max.messages": 2 * n + 10,
                "queue.buffering.max.kbytes": 2_000_000,
                "batch.num.messages": 1_000_000,
            }
        )

    def produce_plain(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0)

    def produce_kw_none(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0, headers=None)

    def produce_empty(send: Any) -> None:
        empty: list[Any] = []
        for i in range(n):
            send(topic, values[i], keys[i], 0, None, None, 0, empty)

    def produce_text_kw(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0, headers=[(key_name, text[i])])

    def produce_text(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0, None, None, 0, [(key_name, text[i])])

    def produce_current(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0, None, None, 0, [(key_name, current[i])])

    def produce_tiny(send: Any) -> None:
        for i in range(n):
            send(topic, values[i], keys[i], 0, None, None, 0, [(key_name, b"x")])

    def produce_two(send: Any) -> None:
        for i in range(n):
            a, b = half[i]
            send(topic, values[i], keys[i], 0, None, None, 0, [(key_name, a), (key_name, b)])

    def map_plain(send: Any) -> None:
        deque(map(send, repeat(topic), values, keys, repeat(0)), maxlen=0)

    def map_compact(send: Any) -> None:
        none = repeat(None)
        headers = map(list, zip(zip(repeat(key_name), current, strict=True), strict=True))
        deque(map(send, repeat(topic), values, keys, repeat(0), none, none, repeat(0), headers), maxlen=0)

    def build_lists(_send: Any) -> None:
        for i in range(n):
            _ = [(key_name, text[i])]

    def build_text(_send: Any) -> None:
        text_values(batch, field, 0, 0)

    def build_current(_send: Any) -> None:
        publisher.compact_provenance_values(batch, names.compact_provenance_prefix(field, 0), 0)

    cases: dict[str, Callable[[Any], None]] = {
        "produce_plain": produce_plain,
        "produce_kw_none": produce_kw_none,
        "produce_empty_list": produce_empty,
        "produce_text_kw": produce_text_kw,
        "produce_text_pos": produce_text,
        "produce_current_pos": produce_current,
        "produce_tiny_pos": produce_tiny,
        "produce_two_headers_pos": produce_two,
        "map_plain": map_plain,
        "map_compact_pos": map_compact,
        "py_build_header_lists": build_lists,
        "build_values_text": build_text,
        "build_values_current": build_current,
    }
    best = {k: float("inf") for k in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            producer = never_sent()
            started = time.perf_counter()
            case(producer.produce)
            best[name] = min(best[name], time.perf_counter() - started)
            producer.purge()
            producer.flush(5)
    return {k: v * 1e9 / n for k, v in best.items()}


def header_wire_bytes(value: bytes) -> int:
    """Bytes one header adds to a record in the v2 record format (header count included)."""

    def varint(x: int) -> int:  # zigzag varint length
        z, size = (x << 1) ^ (x >> 63), 1
        while z >= 0x80:
            z >>= 7
            size += 1
        return size

    key = names.HEADER_PROVENANCE.encode()
    return varint(len(key)) + len(key) + varint(len(value)) + len(value) + (varint(1) - varint(0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
    )
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    # A terminated benchmark still stops its broker (the finally below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown or "plain" not in chosen:
        raise SystemExit(f"--variants: unknown {unknown}; 'plain' is required (the reference)")

    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.stack.kafka import LocalKafka

    work = ROOT / ".eo" / "bench" / f"prov-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    kafka = LocalKafka(home=work / "kafka")
    log("starting a broker for the benchmark")
    bootstrap = kafka.up().bootstrap
    try:
        topic = "sink-prov"
        admin.ensure_topic({"bootstrap.servers": bootstrap}, topic, partitions=args.partitions)
        per = args.records // args.partitions
        parts = {p: staged_batches(per, 1_000_000 + p * per) for p in range(args.partitions)}
        records = per * args.partitions
        header = names.provenance_checkpoint_field(PIPELINE, CHECKPOINT_ID, IDENTITY).encode()
        log(f"warm-up round ({records:,} records per variant)")
        for name in chosen:
            one_round(bootstrap, topic, VARIANTS[name], parts, header)
        loop_s: dict[str, list[float]] = {k: [] for k in chosen}
        flush_s: dict[str, list[float]] = {k: [] for k in chosen}
        cpu_s: dict[str, list[float]] = {k: [] for k in chosen}
        for r in range(args.rounds):
            order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
            for name in order:
                a, b, c = one_round(bootstrap, topic, VARIANTS[name], parts, header)
                loop_s[name].append(a)
                flush_s[name].append(b)
                cpu_s[name].append(c)
            log(
                f"round {r + 1}/{args.rounds}: "
                + " ".join(f"{k}={loop_s[k][-1] + flush_s[k][-1]:.3f}" for k in chosen)
            )
        med = {k: (statistics.median(loop_s[k]), statistics.median(flush_s[k])) for k in chosen}
        cpu = {k: statistics.median(cpu_s[k]) for k in chosen}
        plain = sum(med["plain"])
        head = ("loop_s", "flush_s", "total_s", "ratio", "cpu_s", "ratio")
        print(f"{'variant':10s} " + " ".join(f"{h:>8s}" for h in head))
        for k in chosen:
            lo, fl = med[k]
            print(
                f"{k:10s} {lo:8.3f} {fl:8.3f} {lo + fl:8.3f} {(lo + fl) / plain:8.2f} "
                f"{cpu[k]:8.3f} {cpu[k] / cpu['plain']:8.2f}"
            )
        sample = parts[0][0]
        text = text_values(sample, header, 0, 0)
        current = publisher.compact_provenance_values(sample, names.compact_provenance_prefix(header, 0), 0)
        keys, values = sample.column("key").to_pylist(), sample.column("value").to_pylist()
        wire_text = statistics.mean(header_wire_bytes(v) for v in text)
        wire_compact = statistics.mean(header_wire_bytes(v) for v in current)
        record = statistics.mean(len(k) + len(v) for k, v in zip(keys, values, strict=True))
        print(
            f"header bytes per record on the wire: text {wire_text:.1f}, compact {wire_compact:.1f}; "
            f"key+value {record:.1f}"
        )
        wire = [f"text_header_bytes={wire_text:.1f}", f"compact_header_bytes={wire_compact:.1f}"]
        prof: dict[str, float] = {}
        if not args.no_profile:
            prof = profile(bootstrap, topic, sample, max(3, args.rounds))
            print("profile (ns per record, min over rounds, nothing sent):")
            for k, v in prof.items():
                print(f"  {k:26s} {v:7.0f}")
        lo, fl = med["staged"] if "staged" in med else med["plain"]
        fields = [
            f"records={records}",
            f"rounds={args.rounds}",
            f"plain_s={plain:.3f}",
            f"plain_loop_s={med['plain'][0]:.3f}",
            f"plain_flush_s={med['plain'][1]:.3f}",
            f"header_s={lo + fl:.3f}",
            f"header_loop_s={lo:.3f}",
            f"header_flush_s={fl:.3f}",
            f"ratio={(lo + fl) / plain:.2f}",
            f"plain_cpu_s={cpu['plain']:.3f}",
            f"header_cpu_s={cpu.get('staged', cpu['plain']):.3f}",
            f"cpu_ratio={cpu.get('staged', cpu['plain']) / cpu['plain']:.2f}",
        ]
        fields += [f"{k}_s={sum(med[k]):.3f}" for k in chosen if k not in ("plain", "staged")]
        print("provenance: " + " ".join(fields + wire))
    finally:
        log("stopping the broker")
        kafka.down()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
