"""A sink holding records of both ``eo.prov`` forms: the text form earlier versions wrote and
the compact form eo writes now. The audit, the sink guard and the commit's read-back read
both, and count a record the same whichever form it carries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from airflow_provider_eo import names
from airflow_provider_eo.core import shard
from airflow_provider_eo.core.sink_guard import scan_sink
from airflow_provider_eo.kafka import audit as kafka_audit
from airflow_provider_eo.kafka.publisher import Sent, provenance_values

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def text_form_produce_staged(
    producer: Producer,
    topic: str,
    partition: int,
    batches: Iterable[pa.RecordBatch],
    checkpoint_header: bytes,
    where: str = "",
    sent: Sent | None = None,
) -> int:
    """The publish of an earlier version: the text form of ``eo.prov``, one record at a time."""
    index = 0
    for batch in batches:
        prov = provenance_values(batch, f"{checkpoint_header.decode()} {partition}:", index).to_pylist()
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        for i in range(batch.num_rows):
            producer.produce(
                topic,
                value=values[i],
                key=keys[i],
                partition=partition,
                headers=[(names.HEADER_PROVENANCE, prov[i])],
            )
        index += batch.num_rows
        if sent is not None:
            sent.records += batch.num_rows
        producer.poll(0)
    return index


def _forms(records: list[Any]) -> Counter[str]:
    forms: Counter[str] = Counter()
    for msg in records:
        value = dict(msg.headers() or [])[names.HEADER_PROVENANCE]
        forms["compact" if value[0] == names.PROVENANCE_COMPACT else "text"] += 1
    return forms


def _last_checkpoints(h: Any) -> dict[int, int]:
    """Per sink partition, the highest checkpoint its records name (either form)."""
    last: dict[int, int] = {}
    for msg in h.sink_records():
        fields = names.parse_provenance(dict(msg.headers() or [])[names.HEADER_PROVENANCE])
        parsed = names.parse_checkpoint_field(fields[0], h.pipeline.name) if fields else None
        assert parsed is not None, msg.headers()
        last[msg.partition()] = max(last.get(msg.partition(), -1), parsed[0])
    return last


def _read_back(h: Any) -> dict[int, int]:
    """The commit's read-back proof, per sink partition."""
    identity = h.ledger.get_pipeline(h.pipeline.name).identity
    return {
        p: kafka_audit.last_published_checkpoint(
            h.config, h.pipeline.sink_topic, p, h.pipeline.name, identity, timeout_s=60
        )
        for p in (0, 1)
    }


def test_a_sink_of_both_forms_is_audited_as_one(harness: Callable[..., Any], monkeypatch: Any) -> None:
    h = harness(source_partitions=2, sink_partitions=2, commit_shards=2, max_records_per_checkpoint=250)
    h.produce(500)
    with monkeypatch.context() as m:
        m.setattr(shard, "produce_staged", text_form_produce_staged)
        assert len(h.drain()) == 2  # checkpoints 1 and 2: the text form
    assert _forms(h.sink_records()) == Counter(text=500)
    assert _read_back(h) == _last_checkpoints(h) and max(_last_checkpoints(h).values()) == 2
    h.produce(500, start=500)
    assert len(h.drain()) == 2  # checkpoints 3 and 4: the compact form
    assert _forms(h.sink_records()) == Counter(text=500, compact=500)
    assert _read_back(h) == _last_checkpoints(h) and max(_last_checkpoints(h).values()) == 4

    report = h.assert_exactly_once(expected_records=1000)
    assert report.foreign == 0 and report.sources_duplicated == 0, report.as_dict()
    assert [c.observed for c in report.checkpoints] == [250, 250, 250, 250], report.as_dict()
    assert all(c.source_missing == 0 and c.source_records == 250 for c in report.checkpoints), (
        report.as_dict()
    )

    ident = h.ledger.get_pipeline(h.pipeline.name).identity[: names.PROVENANCE_IDENTITY_CHARS]
    found = scan_sink(h.pipeline)  # the sink guard: one ledger's output, up to checkpoint 4
    assert list(found) == [ident] and found[ident].checkpoint == 4 and found[ident].records == 1000
