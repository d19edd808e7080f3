"""The audit checks the sink against the source, not against our own manifests: a
checkpoint committed without its records is missing, records a transform drops on purpose
are accounted for, and so are records the transform creates."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import EO

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.prepare import StageRequest, StageResult, prepare_checkpoint
from airflow_provider_eo.spark.stager import SparkStager

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


class UnsharedStager:
    """What a Spark worker on another host did before prepare checked its counts: it wrote
    the staged files to a disk the driver does not see, and the driver listed nothing.
    (Reproduced here by writing into another folder and reporting no counts.)"""

    def __init__(self, spark: Any, elsewhere: Path) -> None:
        self.inner = SparkStager(spark)
        self.elsewhere = elsewhere

    def start(self, pipeline: Any) -> None:
        self.inner.start(pipeline)

    def stage(self, request: StageRequest) -> StageResult:
        hidden = dataclasses.replace(request, path=str(self.elsewhere / request.attempt))
        written = self.inner.stage(hidden)
        assert written.rows_written and sum(written.rows_written.values()) > 0  # the executors did write
        # The driver ran the job commit: it sees the output folder (and _SUCCESS), not the files.
        (Path(request.path) / "data").mkdir(parents=True)
        (Path(request.path) / "data" / "_SUCCESS").touch()
        return StageResult(
            files=staging.describe_attempt(request.path), reads=written.reads, app_id=written.app_id
        )


def test_a_checkpoint_committed_without_its_records_is_missing_against_the_source(
    harness: Callable[..., Any], tmp_path: Path
) -> None:
    """Old behaviour's output: 1,000 source records, the checkpoint COMMITTED with 0 staged
    records. The manifest-based audit called it clean; against the source it is 1,000 missing."""
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(1000)
    cp = h.plan()
    prepared = prepare_checkpoint(
        h.pipeline, h.ledger, cp.checkpoint_id, stager=UnsharedStager(h.spark, tmp_path / "worker-disk")
    )
    assert prepared.records == 0 and prepared.records_read == 1000
    h.commit(cp.checkpoint_id)

    report = h.audit()
    (row,) = report.checkpoints
    assert (row.expected, row.observed, row.missing_staged) == (0, 0, 0)  # the manifest agrees...
    assert (row.source_records, row.source_published, row.source_missing) == (1000, 0, 1000)
    assert report.missing == 1000 and not report.ok, report.as_dict()

    cli = h.cli("audit")
    assert cli.returncode == 2, cli.stderr
    assert '"missing": 1000' in cli.stdout


@pytest.mark.parametrize(
    ("transform", "published", "observed"),
    [("drop_multiples_of_ten", 900, 900), ("drop_and_explode", 900, 1000)],
)
def test_records_the_transform_drops_are_accounted_for(
    harness: Callable[..., Any], transform: str, published: int, observed: int
) -> None:
    h = harness(source_partitions=2, sink_partitions=3, transform=f"eo_test_transforms:{transform}")
    h.produce(1000)
    h.drain()
    report = h.assert_exactly_once(expected_records=observed)
    assert report.source_records == 1000 and report.dropped == 100, report.as_dict()
    assert sum(c.source_published for c in report.checkpoints) == published
    for cp in h.ledger.list_checkpoints(h.pipeline.name):
        assert cp.records_read is not None and cp.records_dropped is not None
        assert cp.records_read - cp.records_dropped == sum(
            c.source_published for c in report.checkpoints if c.checkpoint_id == cp.checkpoint_id
        )


def test_a_lost_record_is_missing_even_when_the_transform_drops_others(harness: Callable[..., Any]) -> None:
    """Dropped-by-transform covers exactly the records the prepare counted: one more gone
    (deleted from the staged files before the commit) is one missing."""
    h = harness(source_partitions=1, sink_partitions=1, transform="eo_test_transforms:drop_multiples_of_ten")
    h.produce(100)
    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    prepared = h.ledger.get(h.pipeline.name, cp.checkpoint_id)
    assert (prepared.records_read, prepared.records_dropped, prepared.records) == (100, 10, 90)
    # The ledger's count of dropped records is one too many (as if a record had vanished
    # between the write and the count): the audit must still find the 10 it did not drop.
    with h.ledger._db.write() as s:
        from sqlalchemy import update

        from airflow_provider_eo.ledger.models import Checkpoint

        s.execute(update(Checkpoint).values(records_dropped=0))
    h.commit(cp.checkpoint_id)
    report = h.audit()
    assert (report.source_records, report.dropped) == (100, 0)
    assert report.missing == 10 and not report.ok, report.as_dict()


@pytest.mark.parametrize("transform", ["readme_clean", "select_udf", "select_pandas_udf", "join_static"])
def test_transforms_that_drop_the_provenance_column_are_audited_per_record(
    harness: Callable[..., Any], transform: str
) -> None:
    """The usual transform keeps only the columns it names: the provenance column is carried
    through it anyway, so every source record is named by its output record (none is called
    dropped) and the audit is the per-record one (exit 0)."""
    h = harness(source_partitions=2, sink_partitions=3, transform=f"eo_test_transforms:{transform}")
    h.produce(300)
    h.drain()
    report = h.assert_exactly_once(expected_records=300)
    published = sum(c.source_published for c in report.checkpoints)
    assert (report.source_records, report.dropped, published) == (300, 0, 300), report.as_dict()
    assert report.unpositioned == 0 and report.per_record, report.as_dict()
    assert all(cp.records_created == 0 for cp in h.ledger.list_checkpoints(h.pipeline.name))
    cli = h.cli("audit")
    assert cli.returncode == 0, (cli.stdout, cli.stderr)


class LosingStager:
    """Stages with Spark, then takes the first record of one staged file out (as if it had
    vanished between the write and the commit) and reports the files as they now are: the
    manifest and the commit agree with the files, only the source does not."""

    def __init__(self, spark: Any) -> None:
        self.inner = SparkStager(spark)
        self.lost: tuple[str, int, int] | None = None

    def start(self, pipeline: Any) -> None:
        self.inner.start(pipeline)

    def stage(self, request: StageRequest) -> StageResult:
        import pyarrow.parquet as pq

        written = self.inner.stage(request)
        partition, files = next((p, fs) for p, fs in sorted(written.files.items()) if fs)
        path = f"{request.path}/{files[0].path}"
        table = pq.read_table(path)
        first = table.slice(0, 1).to_pylist()[0]
        self.lost = (first["src_topic"], first["src_partition"], first["src_offset"])
        pq.write_table(table.slice(1), path)
        rows = dict(written.rows_written or {})
        rows[partition] -= 1
        return dataclasses.replace(written, files=staging.describe_attempt(request.path), rows_written=rows)


def test_a_lost_or_duplicated_record_of_a_select_is_named_by_its_source_offset(
    harness: Callable[..., Any],
) -> None:
    """With the provenance carried through `select("key", udf(value))`, the audit checks each
    source record: one record lost after the write is missing, one output record written
    twice is a duplicate, and both are named by their source position."""
    h = harness(source_partitions=2, sink_partitions=2, transform="eo_test_transforms:select_udf")
    h.produce(200)
    cp = h.plan()
    stager = LosingStager(h.spark)
    prepared = prepare_checkpoint(h.pipeline, h.ledger, cp.checkpoint_id, stager=stager)
    assert (prepared.records_read, prepared.records) == (200, 199)
    h.commit(cp.checkpoint_id)
    assert stager.lost is not None
    lost = "{}:{}:{}".format(*stager.lost)

    report = h.audit()
    assert (report.missing, report.duplicates, report.dropped) == (1, 0, 0), report.as_dict()
    assert report.missing_sources == [lost], report.as_dict()

    # One output record written into the sink once more, its provenance header and all.
    copied = h.sink_records()[0]
    producer = Producer(h.config)
    producer.produce(
        h.pipeline.sink_topic,
        key=copied.key(),
        value=copied.value(),
        partition=copied.partition(),
        headers=list(copied.headers() or []),
    )
    assert producer.flush(30) == 0
    source = dict(copied.headers() or [])[names.HEADER_PROVENANCE]
    fields = names.parse_provenance(source)
    assert fields is not None
    report = h.audit()
    assert (report.missing, report.duplicates) == (1, 1), report.as_dict()
    assert report.duplicated_sources == [fields[2].decode()], report.as_dict()
    cli = h.cli("audit")
    assert cli.returncode == 2, (cli.stdout, cli.stderr)


def test_an_aggregation_is_checked_by_count_only_and_says_so(harness: Callable[..., Any]) -> None:
    """An aggregation's output records stand for no one source record: the audit never calls
    the source records dropped, says how many output records carry no source position and
    that they were checked by count only, and exits 4 (not 0: no record was checked one by
    one; not 2: nothing was found duplicated or missing)."""
    h = harness(source_partitions=2, sink_partitions=2, transform="eo_test_transforms:count_per_key")
    h.produce(210, keys=7)
    h.drain()
    report = h.assert_exactly_once()
    observed = sum(c.observed for c in report.checkpoints)
    assert observed >= 7
    assert (report.source_records, report.dropped) == (210, 0), report.as_dict()
    assert report.unpositioned == observed, report.as_dict()
    assert report.source_unchecked == 210 and not report.per_record, report.as_dict()
    for cp in h.ledger.list_checkpoints(h.pipeline.name):
        assert cp.records_dropped is None and cp.records_created == cp.records
    cli = h.cli("audit")
    assert cli.returncode == 4, (cli.stdout, cli.stderr)
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json(), "COLUMNS": "200"}
    text = subprocess.run(
        [EO, "audit", "eo_test_pipelines:from_env"], env=env, capture_output=True, text=True, check=False
    ).stdout
    assert f"{observed} output records carry no source position: checked by count only" in text, text
