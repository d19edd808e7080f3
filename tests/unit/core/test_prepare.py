"""The prepare protocol step (core/prepare.py) with a fake stager: state checks, the manifest
written after the staged files and before the ledger, the losing race, the counts that reach
the ledger. Kafka is the fake cluster (tests/eo_fake_kafka.py) through the clients object;
the ledger is a real SQLite file."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eo_fake_kafka import FakeBroker, FakeClients

from airflow_provider_eo import names, staging
from airflow_provider_eo.core import prepare
from airflow_provider_eo.core.prepare import RangeRead, StageRequest, StageResult
from airflow_provider_eo.errors import DataLossError, PrepareError
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.testing import faults

SINK_PARTITIONS = 3
MAX_BYTES = 12_345
RANGES = (RangeSpec("in", 0, 0, 10), RangeSpec("in", 1, 5, 5), RangeSpec("in", 2, 3, 9))


class FakeStager:
    """Writes ``rows[p]`` rows into sink partition ``p`` as real Parquet files and reports
    ``read[i]`` records for the i-th non-empty range; ``during`` runs inside ``stage``."""

    def __init__(
        self,
        rows: dict[int, int] | None = None,
        read: tuple[int, ...] = (7, 4),
        during: Callable[[StageRequest], None] | None = None,
    ) -> None:
        self.rows = {0: 3, 1: 2, 2: 4} if rows is None else rows
        self.read = read
        self.during = during
        self.started: list[str] = []
        self.requests: list[StageRequest] = []

    def start(self, pipeline: Pipeline) -> None:
        self.started.append(pipeline.name)

    def stage(self, request: StageRequest) -> StageResult:
        self.requests.append(request)
        for partition, n in self.rows.items():
            folder = Path(request.path) / "data" / f"sink_partition={partition}"
            folder.mkdir(parents=True)
            pq.write_table(pa.table({"value": [b"x"] * n}), folder / "part-0.parquet")
        assert not os.path.exists(os.path.join(request.path, names.MANIFEST))
        if self.during is not None:
            self.during(request)
        live = [r for r in request.ranges if r.end > r.start]
        reads = tuple(
            RangeRead(r, n, 1000 * (i + 1), 1000 * (i + 1) + n)
            for i, (r, n) in enumerate(zip(live, self.read, strict=True))
        )
        return StageResult(
            files=staging.describe_attempt(request.path),
            reads=reads,
            app_id="app-fake",
            rows_written={p: n for p, n in self.rows.items() if n},
        )


#: The fake cluster of the test running now (:func:`fake_kafka`).
KAFKA: list[FakeClients] = []


@pytest.fixture(autouse=True)
def fake_kafka() -> Iterator[FakeBroker]:
    """The fake cluster every prepare here asks (:func:`prepare`): source ``in`` has three
    partitions holding offsets [0, 1000); the sink ``out`` has three partitions and a
    ``max.message.bytes`` of MAX_BYTES."""
    broker = FakeBroker(
        partitions={"out": SINK_PARTITIONS},
        logs={("in", p): (0, 1000) for p in range(3)},
        max_message_bytes={"out": MAX_BYTES},
    )
    KAFKA[:] = [FakeClients(broker)]
    yield broker
    KAFKA.clear()


def prepare_checkpoint(*args: Any, **kwargs: Any) -> Any:
    """:func:`~airflow_provider_eo.core.prepare.prepare_checkpoint` against the fake cluster."""
    return prepare.prepare_checkpoint(*args, clients=KAFKA[0], **kwargs)


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "localhost:9"},
        source_topics=["in"],
        sink_topic="out",
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        staging_dir=str(tmp_path / "staging"),
        commit_shards=2,
    )


@pytest.fixture
def ledger(pipeline: Pipeline) -> Iterator[Ledger]:
    with Ledger(pipeline.ledger_url) as led:
        led.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        yield led


def planned(pipeline: Pipeline, ledger: Ledger) -> CheckpointRecord:
    plan = names.commit_plan(pipeline, SINK_PARTITIONS)
    return ledger.plan(pipeline.name, list(RANGES), commit_plan=plan)


def manifests(pipeline: Pipeline) -> list[Path]:
    return sorted(Path(pipeline.staging_dir).rglob(names.MANIFEST))


def test_the_counts_the_stager_observed_reach_the_ledger(
    pipeline: Pipeline, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = planned(pipeline, ledger)
    path = names.attempt_dir(pipeline, cp.checkpoint_id, "a1")
    mark_prepared = ledger.mark_prepared

    def manifest_before_ledger(*args: Any, **kwargs: Any) -> CheckpointRecord:
        assert os.path.exists(os.path.join(path, names.MANIFEST)), "the ledger moved before the manifest"
        return mark_prepared(*args, **kwargs)

    monkeypatch.setattr(ledger, "mark_prepared", manifest_before_ledger)
    stager = FakeStager()
    result = prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager, attempt="a1")

    (request,) = stager.requests
    assert stager.started == ["orders"]
    assert (request.path, request.attempt, request.ranges) == (path, "a1", RANGES)
    assert (request.sink_partitions, request.max_message_bytes, request.time_filter) == (3, MAX_BYTES, None)
    assert request.where == "pipeline 'orders', checkpoint 1"

    assert (result.attempt, result.records, result.records_read, result.note) == ("a1", 9, 11, "")
    got = ledger.get(pipeline.name, cp.checkpoint_id)
    assert got.state is CheckpointState.PREPARED and got == result.checkpoint
    assert (got.prepared_attempt, got.staging_location, got.records) == ("a1", path, 9)
    # Commit plan of 2 shards over 3 partitions: shard 0 = partitions 0 and 2, shard 1 = partition 1.
    assert dict(got.shard_counts) == {0: 3 + 4, 1: 2}
    assert dict(got.range_stats) == {
        ("in", 0): (1000, 1007),
        ("in", 1): (None, None),
        ("in", 2): (2000, 2004),
    }
    assert got.spark_app_id == "app-fake"

    manifest = staging.read_manifest(path)
    assert (manifest.records, manifest.records_read, manifest.sink_partitions) == (9, 11, 3)
    assert manifest.partition_counts() == {0: 3, 1: 2, 2: 4}
    assert [r["read"] for r in manifest.ranges] == [7, 4]


@pytest.mark.parametrize("state", [CheckpointState.PREPARED, CheckpointState.COMMITTED])
def test_a_prepared_or_committed_checkpoint_is_nothing_to_do(
    pipeline: Pipeline, ledger: Ledger, state: CheckpointState
) -> None:
    cp = planned(pipeline, ledger)
    ledger.mark_prepared(
        pipeline.name,
        cp.checkpoint_id,
        attempt="a0",
        staging_location="/s",
        records=5,
        bytes_=50,
        shard_counts={0: 5},
    )
    if state is CheckpointState.COMMITTED:
        for shard in range(2):
            ledger.record_shard(
                pipeline.name,
                cp.checkpoint_id,
                shard,
                transactional_id=f"eo.orders.{shard}",
                producer_id=None,
                producer_epoch=None,
                state="COMMITTED",
                records=5 - 5 * shard,
            )
        ledger.mark_committed(pipeline.name, cp.checkpoint_id)
    stager = FakeStager()
    result = prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager)
    assert stager.requests == []
    assert (result.attempt, result.records, result.note) == (None, 5, f"already {state.value}")
    assert result.checkpoint.state is state and result.checkpoint.prepared_attempt == "a0"
    assert not Path(pipeline.staging_dir).exists()


def test_an_aborted_checkpoint_is_refused(pipeline: Pipeline, ledger: Ledger) -> None:
    cp = planned(pipeline, ledger)
    ledger.abort(pipeline.name, cp.checkpoint_id, reason="test")
    stager = FakeStager()
    with pytest.raises(
        PrepareError, match="checkpoint 1 is ABORTED; only PLANNED checkpoints can be prepared"
    ):
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager)
    assert stager.requests == []


def test_a_failed_stage_writes_no_manifest_and_leaves_the_ledger_alone(
    pipeline: Pipeline, ledger: Ledger
) -> None:
    cp = planned(pipeline, ledger)

    def refuse(request: StageRequest) -> None:
        raise PrepareError(f"{request.where}: an output record exceeds max.message.bytes")

    with pytest.raises(PrepareError, match=r"exceeds max\.message\.bytes"):
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=FakeStager(during=refuse))
    assert manifests(pipeline) == []
    after = ledger.get(pipeline.name, cp.checkpoint_id)
    assert after.state is CheckpointState.PLANNED and after.prepared_attempt is None


@pytest.mark.parametrize(
    ("step", "manifest"), [("prepare.after_write", False), ("prepare.before_ledger", True)]
)
def test_the_crash_points_sit_between_files_manifest_and_ledger(
    pipeline: Pipeline, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, step: str, manifest: bool
) -> None:
    cp = planned(pipeline, ledger)
    monkeypatch.setenv("EO_FAULT", step)
    monkeypatch.setenv("EO_FAULT_ACTION", "exit")
    monkeypatch.setattr(faults, "_HITS", {})
    with pytest.raises(SystemExit):
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=FakeStager(), attempt="a1")
    path = Path(names.attempt_dir(pipeline, cp.checkpoint_id, "a1"))
    assert sorted(path.rglob("*.parquet")), "the staged files are written before either crash point"
    assert (path / names.MANIFEST).exists() is manifest
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED


def test_the_losing_attempt_removes_its_folder_and_returns_the_winner(
    pipeline: Pipeline, ledger: Ledger
) -> None:
    cp = planned(pipeline, ledger)

    def another_attempt_wins(request: StageRequest) -> None:
        ledger.mark_prepared(
            pipeline.name,
            request.checkpoint_id,
            attempt="winner",
            staging_location="/elsewhere",
            records=5,
            bytes_=50,
            shard_counts={0: 5},
        )

    stager = FakeStager(during=another_attempt_wins)
    result = prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager, attempt="loser")
    assert not os.path.exists(stager.requests[0].path)
    assert result.attempt is None
    assert result.note == "another attempt (winner) prepared it first"
    assert (result.records, result.records_read) == (5, 11)
    assert result.checkpoint.prepared_attempt == "winner"
    assert ledger.get(pipeline.name, cp.checkpoint_id).staging_location == "/elsewhere"


def test_attempt_names_are_unique_and_fit_a_folder_name() -> None:
    a, b = prepare.new_attempt(), prepare.new_attempt()
    assert a != b
    assert "/" not in a and " " not in a


class InvisibleStager(FakeStager):
    """Spark's executors wrote the rows (and counted them) into a folder this process does
    not see: the listing of the attempt folder is empty or short."""

    def __init__(self, visible: dict[int, int]) -> None:
        super().__init__()
        self.visible = visible

    def stage(self, request: StageRequest) -> StageResult:
        written = {p: n for p, n in self.rows.items() if n}
        self.rows = self.visible  # only these reach the folder the driver lists
        result = super().stage(request)
        return StageResult(result.files, result.reads, result.app_id, rows_written=written)


@pytest.mark.parametrize("visible", [{}, {0: 3, 2: 4}], ids=["nothing-visible", "one-partition-missing"])
def test_staging_the_driver_cannot_see_is_refused_and_nothing_is_prepared(
    pipeline: Pipeline, ledger: Ledger, visible: dict[int, int]
) -> None:
    from airflow_provider_eo.errors import StagingError

    cp = planned(pipeline, ledger)
    with pytest.raises(StagingError) as err:
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=InvisibleStager(visible), attempt="a1")
    text = str(err.value)
    assert "pipeline 'orders', checkpoint 1" in text and "wrote 9 records" in text
    assert (
        pipeline.staging_dir in text
        and "shared by the Spark driver, every executor and the committer" in text
    )
    assert "sink partition 1: 2 written, 0 listed" in text
    got = ledger.get(pipeline.name, cp.checkpoint_id)
    assert got.state is CheckpointState.PLANNED and got.records is None
    assert manifests(pipeline) == []
    assert not os.path.exists(names.attempt_dir(pipeline, cp.checkpoint_id, "a1"))


def test_the_transforms_dropped_and_created_records_are_counted(pipeline: Pipeline, ledger: Ledger) -> None:
    cp = planned(pipeline, ledger)

    class Counting(FakeStager):
        def stage(self, request: StageRequest) -> StageResult:
            r = super().stage(request)
            return StageResult(r.files, r.reads, r.app_id, r.rows_written, sources_kept=8, created=1)

    result = prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=Counting(), attempt="a1")
    manifest = staging.read_manifest(result.checkpoint.staging_location or "")
    assert (manifest.records_read, manifest.dropped, manifest.created) == (11, 3, 1)
    got = ledger.get(pipeline.name, cp.checkpoint_id)
    assert (got.records_dropped, got.records_created) == (3, 1)


def test_output_that_names_no_source_record_is_never_counted_as_dropping_them(
    pipeline: Pipeline, ledger: Ledger
) -> None:
    """An aggregation's 9 output records carry no source position: the 11 records read went
    into them, or were dropped, the prepare cannot tell, so it counts none as dropped."""
    cp = planned(pipeline, ledger)

    class Aggregating(FakeStager):
        def stage(self, request: StageRequest) -> StageResult:
            r = super().stage(request)
            return StageResult(r.files, r.reads, r.app_id, r.rows_written, sources_kept=0, created=9)

    result = prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=Aggregating(), attempt="a1")
    manifest = staging.read_manifest(result.checkpoint.staging_location or "")
    assert (manifest.records_read, manifest.dropped, manifest.created) == (11, None, 9)
    got = ledger.get(pipeline.name, cp.checkpoint_id)
    assert (got.records_dropped, got.records_created) == (None, 9)


def test_a_filter_that_keeps_nothing_drops_every_record(pipeline: Pipeline, ledger: Ledger) -> None:
    cp = planned(pipeline, ledger)

    class KeepsNothing(FakeStager):
        def stage(self, request: StageRequest) -> StageResult:
            r = super().stage(request)
            return StageResult(r.files, r.reads, r.app_id, r.rows_written, sources_kept=0, created=0)

    prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=KeepsNothing(rows={0: 0}), attempt="a1")
    assert ledger.get(pipeline.name, cp.checkpoint_id).records_dropped == 11


def test_a_relative_staging_dir_is_resolved_once_and_pinned(
    pipeline: Pipeline, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative staging_dir used to be resolved against each process's working folder: a
    commit started elsewhere found no manifest. The first prepare pins the absolute
    location; a prepare started in another folder stages there too."""
    import dataclasses

    relative = dataclasses.replace(pipeline, staging_dir="staging-rel")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cp = planned(relative, ledger)
    first = prepare_checkpoint(relative, ledger, cp.checkpoint_id, stager=FakeStager(), attempt="a1")
    pinned = str(tmp_path / "a" / "staging-rel")
    assert first.checkpoint.staging_location == os.path.join(pinned, "orders", "cp-0000000001", "attempt-a1")
    assert ledger.get_pipeline("orders").staging_dir == pinned

    ledger.abort("orders", cp.checkpoint_id, reason="test: replanned from another folder")
    monkeypatch.chdir(tmp_path / "b")
    cp2 = planned(relative, ledger)
    second = prepare_checkpoint(relative, ledger, cp2.checkpoint_id, stager=FakeStager(), attempt="a2")
    assert (second.checkpoint.staging_location or "").startswith(pinned + os.sep)
    assert not (tmp_path / "b" / "staging-rel").exists()


def test_a_planned_range_kafka_no_longer_has_is_refused_before_the_engine_runs(
    pipeline: Pipeline, ledger: Ledger, fake_kafka: FakeBroker
) -> None:
    """Retention took offsets a PLANNED checkpoint reads: the prepare names them and what to
    do, stages nothing and leaves the checkpoint PLANNED."""
    cp = planned(pipeline, ledger)
    fake_kafka.logs[("in", 0)] = (950, 1000)
    stager = FakeStager()
    with pytest.raises(DataLossError, match=r"in\[0\]: \[0, 10\) \(below the log start 950\)"):
        prepare_checkpoint(pipeline, ledger, cp.checkpoint_id, stager=stager)
    assert stager.requests == [] and manifests(pipeline) == []
    assert ledger.get(pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED


def test_the_sinks_message_limit_reaches_the_stager(
    pipeline: Pipeline, ledger: Ledger, fake_kafka: FakeBroker
) -> None:
    fake_kafka.max_message_bytes["out"] = 4096
    stager = FakeStager()
    prepare_checkpoint(pipeline, ledger, planned(pipeline, ledger).checkpoint_id, stager=stager)
    (request,) = stager.requests
    assert request.max_message_bytes == 4096
