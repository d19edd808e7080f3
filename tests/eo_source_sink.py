"""Exactly-once counted against the SOURCE, not against the ledger: every record a
read_committed consumer sees in the source topics has exactly one output in the sink (as a
read_committed consumer sees it), and the sink holds nothing else.

Each output record names its input in the provenance header (``eo.prov``, third field
``topic:partition:offset``), so a lost record, a duplicate and an output of an aborted input
are each found by position. For transforms that map one input to one output (``identity``,
the demo's ``enrich``): a transform that filters or explodes needs its own count.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.audit import read_sink, read_topic, settled_ends

#: A source record: (topic, partition, offset).
Position = tuple[str, int, int]


def source_positions(config: dict[str, Any], topics: list[str]) -> list[Position]:
    """Every record of ``topics`` a read_committed consumer sees (aborted inputs excluded)."""
    parts = admin.partitions_of(config, topics)
    ends = settled_ends(config, [(t, p) for t, ps in parts.items() for p in ps])
    out: list[Position] = []
    for topic in topics:
        for msg in read_topic(config, topic, ends, isolation="read_committed"):
            out.append((topic, int(msg.partition() or 0), int(msg.offset() or 0)))
    return out


def sink_positions(config: dict[str, Any], sink_topic: str, pipeline_name: str) -> tuple[list[Position], int]:
    """The source position of every read_committed record of ``sink_topic`` written by
    ``pipeline_name``, and how many records carry no such provenance (not ours, or a
    transform that dropped the source columns)."""
    positions: list[Position] = []
    unattributed = 0
    for msg in read_sink(config, sink_topic):
        prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
        fields = names.parse_provenance(prov) if isinstance(prov, bytes) else None
        if (
            fields is None
            or names.parse_checkpoint_field(fields[0], pipeline_name) is None
            or fields[2] == b"-"
        ):
            unattributed += 1
            continue
        topic, partition, offset = fields[2].decode().rsplit(":", 2)
        positions.append((topic, int(partition), int(offset)))
    return positions, unattributed


@dataclass(frozen=True)
class SourceSinkReport:
    """The source compared with the sink, record by record."""

    source: int  # records in the source topics (read_committed)
    sink: int  # records in the sink (read_committed)
    missing: list[Position] = field(default_factory=list)  # source records with no output
    duplicated: dict[Position, int] = field(default_factory=dict)  # outputs per repeated input
    unexpected: list[Position] = field(default_factory=list)  # outputs of no committed input
    unattributed: int = 0  # outputs without this pipeline's provenance

    @property
    def exactly_once(self) -> bool:
        """Every source record once in the sink, nothing else there."""
        return not (self.missing or self.duplicated or self.unexpected or self.unattributed)

    def describe(self) -> str:
        """Counts and the first few positions of each kind of mismatch."""
        return (
            f"source {self.source}, sink {self.sink}: {len(self.missing)} missing "
            f"{sorted(self.missing)[:5]}, {len(self.duplicated)} duplicated "
            f"{sorted(self.duplicated.items())[:5]}, {len(self.unexpected)} unexpected "
            f"{sorted(self.unexpected)[:5]}, {self.unattributed} without provenance"
        )


def compare_source_and_sink(
    config: dict[str, Any], source_topics: list[str], sink_topic: str, pipeline_name: str
) -> SourceSinkReport:
    """Read both sides and compare them by source position."""
    source = Counter(source_positions(config, source_topics))
    out, unattributed = sink_positions(config, sink_topic, pipeline_name)
    sink = Counter(out)
    return SourceSinkReport(
        source=sum(source.values()),
        sink=len(out) + unattributed,
        missing=[p for p in source if p not in sink],
        duplicated={p: n for p, n in sink.items() if n > 1 and p in source},
        unexpected=[p for p in sink if p not in source],
        unattributed=unattributed,
    )


def assert_sink_is_source_exactly_once(
    config: dict[str, Any], pipeline: Any, *, source_records: int | None = None
) -> SourceSinkReport:
    """Fail unless every source record of ``pipeline`` is in its sink exactly once and the
    sink holds nothing else; with ``source_records``, also unless the source holds exactly
    that many records (what the test produced, committed)."""
    report = compare_source_and_sink(config, list(pipeline.source_topics), pipeline.sink_topic, pipeline.name)
    assert report.exactly_once, report.describe()
    if source_records is not None:
        assert report.source == source_records, report.describe()
    assert report.sink == report.source, report.describe()
    return report


def sink_records_per_checkpoint(config: dict[str, Any], sink_topic: str, pipeline_name: str) -> Counter[int]:
    """How many read_committed records of ``sink_topic`` each checkpoint of ``pipeline_name``
    published (by the checkpoint its provenance header names)."""
    counts: Counter[int] = Counter()
    for msg in read_sink(config, sink_topic):
        prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
        fields = names.parse_provenance(prov) if isinstance(prov, bytes) else None
        parsed = names.parse_checkpoint_field(fields[0], pipeline_name) if fields else None
        if parsed is not None:
            counts[parsed[0]] += 1
    return counts


def transactional_range(
    config: dict[str, Any], topic: str, partitions: int, per_batch: int, *, keyless_every: int = 0
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """Write five transactions of ``per_batch`` records (``<tag>-<i>`` on partition ``i %
    partitions``; every ``keyless_every``-th keyless, the rest keyed ``k<i>``, none keyed
    when 0): ``before``, then ``in``, ``aborted`` (aborted), ``in2``, then ``after``. Returns
    the settled (start, end) offsets per partition around ``in`` .. ``in2``: a range whose
    committed records are the ``in`` and ``in2`` ones, an aborted transaction in its middle
    and records past its end."""
    from confluent_kafka import Producer

    producer = Producer({**config, "transactional.id": f"t-{uuid.uuid4().hex}"})
    producer.init_transactions(30)

    def batch(tag: str, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(per_batch):
            key = None if not keyless_every or i % keyless_every == 0 else f"k{i}".encode()
            producer.produce(topic, value=f"{tag}-{i}".encode(), key=key, partition=i % partitions)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)

    batch("before", True)
    parts = [(topic, p) for p in range(partitions)]
    start = settled_ends(config, parts)
    batch("in", True)
    batch("aborted", False)  # in the middle of the range
    batch("in2", True)
    # commit_transaction returns before the commit markers are written: wait for the last
    # stable offset to settle before taking it as the range's end
    end = settled_ends(config, parts)
    batch("after", True)  # past the range: never read
    return start, end
