"""The bounded read's Kafka source options and what was read per range (pure logic)."""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_eo.core.prepare import RangeRead, StageResult
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import source


def _pipeline(**kafka: str) -> Pipeline:
    return Pipeline(
        name="p",
        kafka={"bootstrap.servers": "127.0.0.1:9092", **kafka},
        source_topics=["a"],
        sink_topic="out",
        transform="airflow_provider_eo.examples.transforms:upper",
        ledger_url="sqlite://",
    )


def test_the_bounded_read_never_waits_for_data_it_does_not_need() -> None:
    """A planned range exists in full: the broker must not hold the fetch at the log end
    for the Java client's default 500 ms (about 1 s per checkpoint on two cores)."""
    opts = source.reader_options(_pipeline(), [RangeSpec("a", 0, 0, 10)])
    assert int(opts["kafka.fetch.max.wait.ms"]) == source.FETCH_MAX_WAIT_MS <= 50
    assert opts["kafka.bootstrap.servers"] == "127.0.0.1:9092"
    assert opts["kafka.isolation.level"] == "read_committed"
    assert opts["failOnDataLoss"] == "true"
    assert json.loads(opts["endingOffsets"]) == {"a": {"0": 10}}


def test_the_pipeline_can_set_its_own_fetch_wait() -> None:
    opts = source.reader_options(_pipeline(**{"java.fetch.max.wait.ms": "250"}), [RangeSpec("a", 0, 0, 10)])
    assert opts["kafka.fetch.max.wait.ms"] == "250"


def test_the_pipeline_cannot_turn_off_read_committed() -> None:
    opts = source.reader_options(
        _pipeline(**{"java.isolation.level": "read_uncommitted"}), [RangeSpec("a", 0, 0, 10)]
    )
    assert opts["kafka.isolation.level"] == "read_committed"


def test_source_options_name_exactly_the_live_ranges() -> None:
    ranges = [
        RangeSpec("a", 0, 5, 9),
        RangeSpec("a", 1, 7, 7),  # empty: never read
        RangeSpec("a", 2, 0, 3),
        RangeSpec("b", 0, 10, 11),
    ]
    opts = source.source_options(ranges)
    assert json.loads(opts["assign"]) == {"a": [0, 2], "b": [0]}
    assert json.loads(opts["startingOffsets"]) == {"a": {"0": 5, "2": 0}, "b": {"0": 10}}
    assert json.loads(opts["endingOffsets"]) == {"a": {"0": 9, "2": 3}, "b": {"0": 11}}
    assert source.live_ranges(ranges) == [ranges[0], ranges[2], ranges[3]]


def test_range_reads_count_records_read_not_offsets() -> None:
    live = [RangeSpec("a", 0, 0, 10), RangeSpec("a", 1, 4, 8)]
    # A transactional input: 10 offsets planned but 7 records read (markers, aborted data).
    stats = {"n0": 7, "lo0": 1000, "hi0": 2000, "n1": None, "lo1": None, "hi1": None}
    reads = source.range_reads(live, stats)
    assert reads == [RangeRead(live[0], 7, 1000, 2000), RangeRead(live[1], 0, None, None)]
    staged = StageResult(files={}, reads=tuple(reads), app_id=None)
    assert staged.records_read == 7
    assert staged.manifest_ranges() == [
        {"topic": "a", "partition": 0, "start": 0, "end": 10, "read": 7},
        {"topic": "a", "partition": 1, "start": 4, "end": 8, "read": 0},
    ]
    assert staged.range_stats() == {("a", 0): (1000, 2000), ("a", 1): (None, None)}


def test_range_reads_of_nothing() -> None:
    assert source.range_reads([], {}) == []


def test_every_read_of_a_pipeline_uses_its_own_stable_reader_group() -> None:
    """Spark pools executor consumers by group id: one id per pipeline, the same for every
    checkpoint (a fresh random one per read made a new consumer per task), never another
    pipeline's, never the group the commit moves; a pipeline's ``java.group.id`` wins."""
    first = source.reader_options(_pipeline(), [RangeSpec("a", 0, 0, 10)])["kafka.group.id"]
    later = source.reader_options(_pipeline(), [RangeSpec("a", 0, 10, 99)])["kafka.group.id"]
    other = Pipeline(
        name="q",
        kafka={"bootstrap.servers": "127.0.0.1:9092"},
        source_topics=["a"],
        sink_topic="out",
        ledger_url="sqlite://",
    )
    assert first == later == "eo-read.p"
    assert source.reader_options(other, [RangeSpec("a", 0, 0, 10)])["kafka.group.id"] == "eo-read.q"
    assert first != _pipeline().group_id
    own = source.reader_options(_pipeline(**{"java.group.id": "mine"}), [RangeSpec("a", 0, 0, 10)])
    assert own["kafka.group.id"] == "mine"


def test_only_a_small_checkpoint_is_read_by_the_driver(monkeypatch: Any) -> None:
    """Above DRIVER_READ_MAX_RECORDS offsets, or when the caller does not ask for a driver
    read (a checkpoint staged on the executors), Spark's Kafka source reads: the driver
    never starts reading."""
    from airflow_provider_eo.kafka import source_read

    def no_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the driver read a checkpoint it should leave to Spark")

    monkeypatch.setattr(source_read, "read_records", no_read)
    big = [
        RangeSpec("a", 0, 0, source.DRIVER_READ_MAX_RECORDS // 2),
        RangeSpec("a", 1, 5, 6 + source.DRIVER_READ_MAX_RECORDS // 2),
    ]
    assert source.driver_source(None, _pipeline(), big) is None  # type: ignore[arg-type]
    monkeypatch.setattr(source, "kafka_source", lambda spark, pipeline, ranges: "spark's read")
    assert source.read_ranges(None, _pipeline(), [RangeSpec("a", 0, 0, 10)]) == "spark's read"  # type: ignore[arg-type,comparison-overlap]


def test_a_driver_read_that_met_anything_but_records_leaves_the_read_to_spark(monkeypatch: Any) -> None:
    """read_records answers None (a refusal, a lost range, a time-out): no DataFrame is built
    from it, the caller reads with Spark's Kafka source."""
    from airflow_provider_eo.kafka import source_read

    asked: list[Any] = []

    def refused(config: Any, spans: Any, *, group: str) -> None:
        asked.append((list(spans), group))
        return None

    monkeypatch.setattr(source_read, "read_records", refused)
    assert source.driver_source(None, _pipeline(), [RangeSpec("a", 0, 3, 10)]) is None  # type: ignore[arg-type]
    assert asked == [([("a", 0, 3, 10)], source.DRIVER_READER_GROUP)]


def test_a_driver_jvm_that_refuses_arrow_data_leaves_every_read_to_spark(monkeypatch: Any) -> None:
    """A driver JVM started without Spark's Java module options (not by spark-submit's
    launcher: the tests' standalone cluster-mode Python driver) refuses a DataFrame built from
    Arrow data: that read and every later one of the same JVM go to Spark's Kafka source (the
    driver stops reading)."""
    import pyarrow as pa

    from airflow_provider_eo.kafka import source_read

    reads: list[int] = []

    def read(config: Any, spans: Any, *, group: str) -> pa.Table:
        reads.append(1)
        return pa.table({"offset": [1]})

    class RefusingSession:
        def createDataFrame(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("sun.misc.Unsafe or java.nio.DirectByteBuffer.<init>(long, int) not available")

    monkeypatch.setattr(source_read, "read_records", read)
    monkeypatch.setattr(source, "_ARROW_REFUSED", set())
    small = [RangeSpec("a", 0, 0, 10)]
    assert source.driver_source(RefusingSession(), _pipeline(), small) is None  # type: ignore[arg-type]
    assert source.driver_source(RefusingSession(), _pipeline(), small) is None  # type: ignore[arg-type]
    assert reads == [1]
