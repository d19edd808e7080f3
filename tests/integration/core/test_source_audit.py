"""The audit checks the sink against the source, not against our own manifests: a
checkpoint committed without its records is missing, records a transform drops on purpose
are accounted for, and so are records the transform creates."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo import staging
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
