"""Kafka error sorting of the transactional publisher."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from airflow_provider_eo import names
from airflow_provider_eo.errors import CommitError, CommitFenced, TransactionalIdUnauthorized
from airflow_provider_eo.kafka.publisher import (
    Abortable,
    DeliveryFailures,
    ProducerLost,
    Sent,
    compact_provenance_values,
    kafka_call,
    largest_record,
    produce_staged,
    provenance_values,
)


def _raiser(errors: list[KafkaError]) -> Any:
    def call() -> str:
        if errors:
            raise KafkaException(errors.pop(0))
        return "ok"

    return call


def test_retriable_is_repeated() -> None:
    errs = [KafkaError(KafkaError._TIMED_OUT, "t", retriable=True)] * 2
    assert kafka_call("x", _raiser(list(errs))) == "ok"


def test_retriable_until_deadline_is_producer_lost() -> None:
    errs = [KafkaError(KafkaError._TIMED_OUT, "t", retriable=True)] * 100
    with pytest.raises(ProducerLost):
        kafka_call("commit_transaction", _raiser(errs), deadline_s=0.3)


def test_abortable_and_fatal_and_unknown() -> None:
    with pytest.raises(Abortable):
        kafka_call("x", _raiser([KafkaError(KafkaError._STATE, "s", txn_requires_abort=True)]))
    with pytest.raises(CommitFenced, match="fenced"):
        kafka_call("x", _raiser([KafkaError(KafkaError._FENCED, "f", fatal=True)]))
    with pytest.raises(CommitError, match="unclassified"):
        kafka_call("x", _raiser([KafkaError(KafkaError.UNKNOWN, "u")]))


def test_acl_refusal_is_not_reported_as_a_takeover() -> None:
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED is an ACL problem, not a competing committer."""
    err = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied", fatal=True)
    with pytest.raises(TransactionalIdUnauthorized, match="ACLs") as info:
        kafka_call("init_transactions", _raiser([err]))
    assert not isinstance(info.value, CommitFenced)
    assert "took over" not in str(info.value)


def _staged_batch(n: int, *, with_src: bool = True, user_headers: list[Any] | None = None) -> pa.RecordBatch:
    hdr_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([f"k{i}".encode() if i % 3 else None for i in range(n)], pa.binary()),
            "value": pa.array([f"v{i}".encode() for i in range(n)], pa.binary()),
            "headers": pa.array(user_headers or [None] * n, hdr_type),
            "src_topic": pa.array(["orders" if with_src else None] * n, pa.string()),
            "src_partition": pa.array([2 if with_src else None] * n, pa.int32()),
            "src_offset": pa.array([100 + i if with_src else None for i in range(n)], pa.int64()),
        }
    )


class _FakeProducer:
    """Records produce() calls; raises BufferError on the calls listed in ``full_at``."""

    def __init__(self, full_at: set[int] | None = None) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.calls = 0
        self.full_at = full_at or set()
        self.polls = 0

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's ``produce()``, its positional order included."""
        self.calls += 1
        if self.calls in self.full_at:
            raise BufferError("queue full")
        self.sent.append((topic, value, key, partition, headers))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def test_provenance_values_vectorized() -> None:
    batch = _staged_batch(3)
    got = provenance_values(batch, "orders:17 3:", 40).to_pylist()
    assert got == [
        b"orders:17 3:40 orders:2:100",
        b"orders:17 3:41 orders:2:101",
        b"orders:17 3:42 orders:2:102",
    ]
    dropped = provenance_values(_staged_batch(2, with_src=False), "p:1 0:", 0).to_pylist()
    assert dropped == [b"p:1 0:0 -", b"p:1 0:1 -"]
    for value in got + dropped:
        assert names.parse_provenance(value) is not None
    assert names.parse_provenance(b"something else") is None


def test_compact_provenance_values_say_what_the_text_form_says() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "src_topic": pa.array(["orders", None, "in-2", "x", "orders"], pa.string()),
            "src_partition": pa.array([2, None, 0, None, 2**31 - 1], pa.int32()),
            "src_offset": pa.array([100, None, 2**62, 5, 0], pa.int64()),
        }
    )
    field = names.provenance_checkpoint_field("orders", 17, "0123456789abcdef").encode()
    compact = compact_provenance_values(batch, names.compact_provenance_prefix(field, 3), 127)
    text = provenance_values(batch, f"{field.decode()} 3:", 127).to_pylist()
    assert [names.parse_provenance(v) for v in compact] == [names.parse_provenance(v) for v in text]
    assert names.parse_provenance(compact[1]) == (field, b"3:128", b"-")
    assert names.parse_provenance(compact[3]) == (field, b"3:130", b"-")  # a position with a null part
    assert compact[0] == names.compact_provenance(field, 3, 127, ("orders", 2, 100))
    assert sum(map(len, compact)) < sum(map(len, text))


def test_compact_provenance_values_match_the_per_record_encoding() -> None:
    """The bulk builder against ``names.compact_provenance`` record by record: random
    positions and nulls, several topics, numbers on every varint length, sliced batches."""
    import random

    rng = random.Random(7)
    n = 500
    topics = [rng.choice(["a", "orders", "in.put-2", None]) for _ in range(n)]
    parts = [None if rng.random() < 0.05 else rng.choice([0, 1, 127, 128, 2**31 - 1]) for _ in range(n)]
    offsets = [None if rng.random() < 0.05 else rng.randrange(2 ** rng.randrange(1, 63)) for _ in range(n)]
    batch = pa.RecordBatch.from_pydict(
        {
            "src_topic": pa.array(topics, pa.string()),
            "src_partition": pa.array(parts, pa.int32()),
            "src_offset": pa.array(offsets, pa.int64()),
        }
    )
    field = b"orders:9:abcdef01"
    for start, first_index in ((0, 0), (3, 2**40), (250, 5)):
        part = batch.slice(start, 200)
        got = compact_provenance_values(part, names.compact_provenance_prefix(field, 4), first_index)
        want = [
            names.compact_provenance(
                field,
                4,
                first_index + i,
                None if None in (t, p, o) else (t, p, o),  # type: ignore[arg-type]
            )
            for i, (t, p, o) in enumerate(
                zip(
                    topics[start : start + 200],
                    parts[start : start + 200],
                    offsets[start : start + 200],
                    strict=True,
                )
            )
        ]
        assert got == want
    assert compact_provenance_values(batch.slice(0, 0), b"\x01", 0) == []


def test_produce_staged_order_headers_and_backpressure() -> None:
    producer = _FakeProducer(full_at={2})  # the second record meets a full queue once
    user = [None, [{"key": "trace", "value": b"t1"}], None, None]
    n = produce_staged(
        producer,  # type: ignore[arg-type]
        "sink",
        3,
        [_staged_batch(4, user_headers=user), _staged_batch(0), _staged_batch(2)],
        b"orders:17",
    )
    assert n == 6
    assert [s[1] for s in producer.sent] == [b"v0", b"v1", b"v2", b"v3", b"v0", b"v1"]
    assert [s[2] for s in producer.sent][:3] == [None, b"k1", b"k2"]
    assert {s[0] for s in producer.sent} == {"sink"} and {s[3] for s in producer.sent} == {3}
    prov = [dict(s[4])[names.HEADER_PROVENANCE] for s in producer.sent]
    assert all(p[0] == names.PROVENANCE_COMPACT for p in prov)  # eo writes the compact form
    # The index runs on across batches; it is unique within the sink partition.
    assert [names.parse_provenance(p)[1] for p in prov] == [f"3:{i}".encode() for i in range(6)]  # type: ignore[index]
    assert producer.sent[1][4] == [("trace", b"t1"), (names.HEADER_PROVENANCE, prov[1])]
    assert producer.polls >= 3  # delivery reports served after each batch and when full


def test_commit_produce_path_does_not_import_pandas(tmp_path: Any) -> None:
    """pandas costs a fresh commit process ~0.3 s: staged files are read and produced
    without it (pa.array / pa.scalar on Python values would pull it in)."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    path = tmp_path / "part.parquet"
    pq.write_table(pa.Table.from_batches([_staged_batch(50)]), path)
    code = f"""
import sys
from airflow_provider_eo import staging
from airflow_provider_eo.kafka.publisher import produce_staged

class P:
    def produce(self, *a, **k): pass
    def poll(self, t): return 0

f = staging.StagedFile(path={path.name!r}, records=50, bytes=0, sha256="")
n = produce_staged(P(), "t", 0, staging.iter_batches({str(tmp_path)!r}, [f]), b"p:1")
assert n == 50, n
assert "pandas" not in sys.modules, "pandas was imported"
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


class _StateProducer(_FakeProducer):
    """produce() raises KafkaException(_STATE) from the given call on (a failed txn)."""

    def __init__(self, state_from: int) -> None:
        super().__init__()
        self.state_from = state_from

    def produce(
        self, topic: str, value: Any = None, key: Any = None, partition: int = -1, *a: Any, **kw: Any
    ) -> None:
        if self.calls + 1 >= self.state_from:
            self.calls += 1
            raise KafkaException(KafkaError(KafkaError._STATE, "Unable to produce message"))
        super().produce(topic, value, key, partition, *a)


def test_produce_in_a_failed_transaction_is_abortable() -> None:
    sent = Sent()
    with pytest.raises(Abortable, match="abortable state"):
        produce_staged(_StateProducer(3), "sink", 0, [_staged_batch(5)], b"p:1", sent=sent)  # type: ignore[arg-type]
    assert sent.records == 2  # the third record was refused, not taken
    sent = Sent()
    with pytest.raises(Abortable):  # in the second batch, after a full queue
        producer = _StateProducer(9)
        producer.full_at = {7}
        produce_staged(producer, "sink", 0, [_staged_batch(5), _staged_batch(5)], b"p:1", sent=sent)  # type: ignore[arg-type]
    assert sent.records == 7 and len(producer.sent) == 7  # 5, then 2 (one of them retried)


class _Report:
    def __init__(self, partition: int) -> None:
        self._partition = partition

    def partition(self) -> int:
        return self._partition


def test_delivery_failures_sorted_permanent_vs_transient_and_purge_ignored() -> None:
    failures = DeliveryFailures()
    failures(None, _Report(0))
    failures(KafkaError(KafkaError._PURGE_QUEUE), _Report(0))
    assert not failures and failures.describe() == "no delivery failed"
    failures(KafkaError(KafkaError._MSG_TIMED_OUT), _Report(1))
    assert failures and not failures.permanent
    failures(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Report(2))
    assert failures.permanent
    text = failures.describe()
    assert "2 record(s) of sink partition 1, 2" in text and "MSG_SIZE_TOO_LARGE" in text


def test_largest_record_names_its_index_and_source() -> None:
    small, big = _staged_batch(3), _staged_batch(4)
    values = big.column("value").to_pylist()
    values[2] = b"x" * 500
    big = big.set_column(1, "value", pa.array(values, pa.binary()))
    assert largest_record([small, _staged_batch(0), big]) == (3 + 2, "orders:2:102", 502)
    assert largest_record([]) is None
    assert largest_record([_staged_batch(2, with_src=False)]) == (1, "-", 4)


class _FencedMidFlush:
    """A transactional producer fenced while flushing, whose fatal error confluent-kafka
    lost on the way (``SystemError`` with no cause); ``begin_transaction`` answers with it."""

    def __init__(self, fatal: bool) -> None:
        self.fatal = fatal
        self.begun = 0

    def flush(self, timeout: float) -> int:
        raise SystemError("<built-in method flush> returned NULL without setting an exception")

    def begin_transaction(self) -> None:
        self.begun += 1
        if self.fatal:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
        raise KafkaException(KafkaError(KafkaError._STATE, "Operation not valid in state InTransaction"))


def test_a_fatal_error_lost_by_the_client_mid_flush_is_found_and_sorted() -> None:
    from airflow_provider_eo.kafka.publish_errors import serve

    fenced = _FencedMidFlush(fatal=True)
    with pytest.raises(CommitFenced, match="failed fatally"):
        serve("flush", fenced.flush, 1.0, where="p: ", in_transaction=True)
    healthy = _FencedMidFlush(fatal=False)  # not fatal: the SystemError stays what it is
    with pytest.raises(SystemError):
        serve("flush", healthy.flush, 1.0, in_transaction=True)
    outside = _FencedMidFlush(fatal=True)  # no open transaction: never probed
    with pytest.raises(SystemError):
        serve("flush", outside.flush, 1.0)
    assert outside.begun == 0
