"""Several checkpoints in a row, across partitions, with transactional input."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def assert_source_order_per_key(h: Any, total: int, sink_partitions: int) -> None:
    """Every input once, in source order per key, in the partition Java would pick."""
    from airflow_provider_eo.kafka.partitioner import java_partition

    by_key: dict[str, list[int]] = defaultdict(list)
    for msg in sorted(h.sink_records(), key=lambda m: (m.partition(), m.offset())):
        key = msg.key().decode()
        assert msg.partition() == java_partition(msg.key(), sink_partitions)
        by_key[key].append(int(msg.value().decode().split(":")[1]))
    assert sorted(i for seq in by_key.values() for i in seq) == list(range(total))
    for key, seq in by_key.items():
        assert seq == sorted(seq), f"order of {key} broken"


@pytest.mark.parametrize(
    ("transform", "min_records", "one_file"),
    [
        ("eo_test_transforms:identity", 0, False),
        ("eo_test_transforms:reshuffled", 0, True),
        ("eo_test_transforms:identity", 1_000_000, True),
    ],
)
def test_staging_path_follows_the_plan(
    harness: Callable[..., Any], transform: str, min_records: int, one_file: bool
) -> None:
    """On the executors (``spark_commit_min_records=0``) a narrow transform is staged without
    a shuffle (files per source task); one that shuffles is repartitioned by sink partition.
    A checkpoint below ``spark_commit_min_records`` is staged from the driver, one file per
    sink partition. All keep source order per key."""
    from airflow_provider_eo import staging

    h = harness(
        source_partitions=3,
        sink_partitions=2,
        transform=transform,
        keep_committed_staging=1,
        spark_commit_min_records=min_records,
    )
    h.produce(300, keys=7)
    (result,) = h.drain()
    assert_source_order_per_key(h, 300, 2)
    files = staging.describe_attempt(result.checkpoint.staging_location)
    # Each source task writes its own file into a sink partition; after the shuffle, one each.
    per_partition = [len(f) for f in files.values()]
    assert (max(per_partition) == 1) if one_file else (max(per_partition) > 1), per_partition
    h.assert_exactly_once(expected_records=300)


def test_several_checkpoints_three_partitions_order_kept(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=3, sink_partitions=4, max_records_per_checkpoint=250)
    h.produce(400, keys=11)
    first = h.drain()
    h.produce(300, keys=11, start=400)
    second = h.drain()
    assert len(first) == 2 and len(second) == 2
    cps = h.ledger.list_checkpoints(h.pipeline.name)
    assert [c.state for c in cps] == [CheckpointState.COMMITTED] * 4
    # contiguous ranges per partition
    ends: dict[tuple[str, int], int] = {}
    for cp in cps:
        for r in cp.ranges:
            assert r.start == ends.get(r.key, r.start)
            ends[r.key] = r.end
    h.assert_exactly_once(expected_records=700)
    assert_source_order_per_key(h, 700, 4)
    # the pipeline's consumer group sits at the end of what was committed
    group = admin.committed_group_offsets(h.config, h.pipeline.group_id, list(ends))
    assert group == ends


def test_aborted_input_transactions_never_reach_the_sink(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=2)
    h.produce(50, txn="commit")
    h.produce(50, start=50, txn="abort")
    h.produce(50, start=100, txn="commit")
    h.drain()
    values = sorted(int(m.value().decode().split(":")[1]) for m in h.sink_records())
    assert values == list(range(50)) + list(range(100, 150))
    report = h.assert_exactly_once(expected_records=100)
    assert report.checkpoints[0].expected == 100


def test_rerunning_a_committed_checkpoint_is_a_noop(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(60)
    (result,) = h.drain()
    cid = result.checkpoint.checkpoint_id
    parts = [(h.pipeline.sink_topic, p) for p in range(2)]
    before = admin.list_offsets(h.config, parts, spec="latest")
    again = h.commit(cid)
    assert again.published == 0 and again.note == "already COMMITTED"
    assert h.prepare(cid).attempt is None
    assert admin.list_offsets(h.config, parts, spec="latest") == before
    h.assert_exactly_once(expected_records=60)


def test_one_to_many_transform_keeps_exact_provenance(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=2, sink_partitions=3, transform="eo_test_transforms:explode_twice")
    h.produce(40)
    h.drain()
    h.assert_exactly_once(expected_records=80)
