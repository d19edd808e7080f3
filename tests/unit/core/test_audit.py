"""The auditor's accounting (core/audit.py) on records handed to it: the sink's provenance
headers, the dead-letter topic's headers and the source's offsets are faked; the ledger is a
real SQLite file. Each source record must be accounted for exactly once: published once,
dropped by the transform, or one dead letter."""

from __future__ import annotations

from typing import Any

import pytest
from eo_ledgers import LedgerFactory

from airflow_provider_eo import names
from airflow_provider_eo.core import audit
from airflow_provider_eo.kafka.source_read import SourceRecords
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline

SOURCE, SINK, DLQ = "in", "out", "dlq"


class Msg:
    """A consumed record: only its headers matter to the audit."""

    def __init__(self, headers: dict[str, bytes]) -> None:
        self._headers = list(headers.items())

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


@pytest.fixture
def pipeline() -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "fake:9092"},
        source_topics=[SOURCE],
        sink_topic=SINK,
        dead_letter_topic=DLQ,
        max_dead_letters_per_checkpoint=5,
    )


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(pipeline="orders")


class Topics:
    """What the faked reads return: the sink's and the dead-letter topic's records, and the
    source offsets of partition ``in[0]``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, ledger: Ledger) -> None:
        self.ident = ledger.get_pipeline("orders").identity
        self.records: dict[str, list[Msg]] = {SINK: [], DLQ: []}
        self.source: list[int] = []
        monkeypatch.setattr(audit, "read_sink", lambda config, topic: list(self.records[topic]))
        monkeypatch.setattr(audit, "read_source_ranges", self._read_source)

    def _read_source(self, config: Any, hulls: list[tuple[str, int, int, int]]) -> dict[Any, SourceRecords]:
        return {(t, p): SourceRecords([(o, 0) for o in self.source if s <= o < e]) for t, p, s, e in hulls}

    def published(self, checkpoint: int, index: int, offset: int | None) -> None:
        """An output record of ``checkpoint`` at sink position ``0:index``, naming source
        offset ``in:0:offset`` (None: no source position)."""
        src = "-" if offset is None else f"{SOURCE}:0:{offset}"
        prov = f"{names.provenance_checkpoint_field('orders', checkpoint, self.ident)} 0:{index} {src}"
        self.records[SINK].append(Msg({names.HEADER_PROVENANCE: prov.encode()}))

    def dead_letter(self, checkpoint: int, offset: int) -> None:
        self.records[DLQ].append(
            Msg(
                {
                    names.HEADER_DLQ_TOPIC: SOURCE.encode(),
                    names.HEADER_DLQ_PARTITION: b"0",
                    names.HEADER_DLQ_OFFSET: str(offset).encode(),
                    names.HEADER_DLQ_PIPELINE: b"orders",
                    names.HEADER_DLQ_CHECKPOINT: str(checkpoint).encode(),
                    names.HEADER_DLQ_IDENTITY: self.ident[: names.PROVENANCE_IDENTITY_CHARS].encode(),
                }
            )
        )


def committed(ledger: Ledger, end: int, *, records: int, **counts: int | None) -> int:
    """A COMMITTED checkpoint reading ``in[0]`` up to ``end`` with these prepare counts."""
    last = ledger.last_committed("orders")
    start = 0 if last is None else last.ranges[0].end
    cp = ledger.plan("orders", [RangeSpec(SOURCE, 0, start, end)])
    ledger.mark_prepared(
        "orders",
        cp.checkpoint_id,
        attempt="a1",
        staging_location="/nowhere",
        records=records,
        bytes_=0,
        shard_counts={},
        records_read=end - start,
        **counts,  # type: ignore[arg-type]
    )
    ledger.mark_committed("orders", cp.checkpoint_id)
    return cp.checkpoint_id


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch, ledger: Ledger) -> Topics:
    return Topics(monkeypatch, ledger)


def _published_with_one_dead_letter(ledger: Ledger, topics: Topics) -> int:
    """Checkpoint 1: source offsets 0..3; 0..2 published, 3 sent to the dead-letter topic."""
    cid = committed(ledger, 4, records=3, records_dropped=0, records_created=0, dead_letters=1)
    topics.source = [0, 1, 2, 3]
    for i in range(3):
        topics.published(cid, i, i)
    topics.dead_letter(cid, 3)
    return cid


def test_each_source_record_accounted_for_once_is_exactly_once(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    _published_with_one_dead_letter(ledger, topics)
    report = audit.audit_pipeline(pipeline, ledger)
    assert (report.duplicates, report.missing, report.dead_letters, report.source_records) == (0, 0, 1, 4)
    assert report.ok and report.per_record and report.outcome == "exactly once"


def test_a_dead_letter_sent_twice_is_a_duplicate(pipeline: Pipeline, ledger: Ledger, topics: Topics) -> None:
    cid = _published_with_one_dead_letter(ledger, topics)
    topics.dead_letter(cid, 3)
    report = audit.audit_pipeline(pipeline, ledger)
    assert (report.duplicates, report.missing) == (1, 0), report.as_dict()
    assert report.duplicated_sources == [f"{SOURCE}:0:3"]
    assert not report.ok and report.outcome == "NOT exactly once"


def test_a_dead_letter_also_published_is_a_duplicate(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    cid = _published_with_one_dead_letter(ledger, topics)
    topics.published(cid, 3, 3)  # its output reached the sink as well
    report = audit.audit_pipeline(pipeline, ledger)
    assert report.duplicates == 1, report.as_dict()
    assert report.duplicated_sources == [f"{SOURCE}:0:3"]
    assert not report.ok


def test_a_source_record_published_by_two_checkpoints_and_a_dead_letter_counts_each_copy(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    cid = _published_with_one_dead_letter(ledger, topics)
    second = committed(ledger, 6, records=2, records_dropped=0, records_created=0, dead_letters=0)
    topics.source += [4, 5]
    topics.published(second, 0, 4)
    topics.published(second, 1, 5)
    topics.published(second, 2, 1)  # offset 1 once more, by the second checkpoint
    topics.dead_letter(cid, 1)  # and as a dead letter
    report = audit.audit_pipeline(pipeline, ledger)
    assert report.duplicates == 2, report.as_dict()  # two copies of offset 1 too many
    assert report.duplicated_sources == [f"{SOURCE}:0:1"]


def test_records_the_transform_dropped_are_accounted_for(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    cid = committed(ledger, 4, records=3, records_dropped=1, records_created=0, dead_letters=0)
    topics.source = [0, 1, 2, 3]
    for i, offset in enumerate((0, 1, 3)):
        topics.published(cid, i, offset)
    report = audit.audit_pipeline(pipeline, ledger)
    assert (report.dropped, report.missing, report.unpositioned) == (1, 0, 0)
    assert report.ok and report.per_record


def test_a_source_record_nobody_accounts_for_is_missing_and_named(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    cid = committed(ledger, 4, records=3, records_dropped=0, records_created=0, dead_letters=0)
    topics.source = [0, 1, 2, 3]
    for i, offset in enumerate((0, 1, 3)):
        topics.published(cid, i, offset)
    report = audit.audit_pipeline(pipeline, ledger)
    assert report.missing == 1 and report.missing_sources == [f"{SOURCE}:0:2"]
    assert report.outcome == "NOT exactly once"


def test_output_without_source_positions_is_checked_by_count_only(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    """An aggregation's output names no source record: the prepare could not tell what it
    dropped (None), the audit never calls the source records dropped or missing, and says
    they were checked by count only (the staged records, each once)."""
    cid = committed(ledger, 4, records=2, records_dropped=None, records_created=2, dead_letters=0)
    topics.source = [0, 1, 2, 3]
    topics.published(cid, 0, None)
    topics.published(cid, 1, None)
    report = audit.audit_pipeline(pipeline, ledger)
    assert (report.duplicates, report.missing, report.dropped) == (0, 0, 0), report.as_dict()
    assert (report.unpositioned, report.source_unchecked) == (2, 4)
    assert report.ok and not report.per_record
    assert report.outcome == "checked by count only"

    topics.published(cid, 1, None)  # a staged position twice is still a duplicate
    assert audit.audit_pipeline(pipeline, ledger).outcome == "NOT exactly once"


def test_a_checkpoint_prepared_before_the_counts_is_still_checked_per_record(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    """Rows prepared before the prepare counted (no dropped, no created count): a source
    record no output names is missing, as before."""
    cid = committed(ledger, 4, records=3, records_dropped=None, records_created=None, dead_letters=None)
    topics.source = [0, 1, 2, 3]
    for i in range(3):
        topics.published(cid, i, i)
    report = audit.audit_pipeline(pipeline, ledger)
    assert report.missing == 1 and report.per_record


def test_an_output_record_written_twice_is_named_by_its_source(
    pipeline: Pipeline, ledger: Ledger, topics: Topics
) -> None:
    cid = _published_with_one_dead_letter(ledger, topics)
    topics.published(cid, 1, 1)  # sink position 0:1 once more
    report = audit.audit_pipeline(pipeline, ledger)
    assert (report.duplicates, report.missing) == (1, 0), report.as_dict()
    assert report.duplicated_sources == [f"{SOURCE}:0:1"]
