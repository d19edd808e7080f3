"""The Structured Streaming sink's pure parts: reading Spark's offset log, and what a batch
calls for given the ledger's newest checkpoint."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_eo.core.batches import BatchOutOfStep, BatchPosition, QueryIdentityMismatch, decide
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, RangeSpec
from airflow_provider_eo.spark.offset_log import (
    OffsetLogError,
    kafka_offsets,
    parse_offset_log,
    parse_source_initial,
)

# An offset-log file as Spark 4 writes it (metadata line shortened).
LOG = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795683043499,"conf":{}}\n{"ssin":{"0":30,"1":30}}'
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
R = (RangeSpec("src", 0, 10, 20), RangeSpec("src", 1, 5, 9))


def test_offset_log_entries_and_kafka_offsets() -> None:
    entries = parse_offset_log(LOG, where="w")
    assert entries == ['{"ssin":{"0":30,"1":30}}']
    assert kafka_offsets(entries[0]) == {("ssin", 0): 30, ("ssin", 1): 30}
    # a second source without an offset yet, a non-Kafka source, a trailing newline
    two = parse_offset_log(LOG + "\n-\n5\n", where="w")
    assert two[1] is None and kafka_offsets(two[1]) is None
    assert kafka_offsets(two[2]) is None  # the rate source's offset is a number
    assert kafka_offsets('{"t":{"0":"x"}}') is None


def test_unknown_offset_log_version_is_named() -> None:
    with pytest.raises(OffsetLogError, match="offset log version 'v2'"):
        parse_offset_log("v2\n{}\n{}", where="pipeline 'p', batch 3")


def test_source_initial_offsets_file() -> None:
    # KafkaSourceInitialOffsetWriter: a NUL byte, the version line, the offsets
    assert kafka_offsets(parse_source_initial('\x00v1\n{"ssin":{"0":0,"1":4}}')) == {
        ("ssin", 0): 0,
        ("ssin", 1): 4,
    }


def cp(cid: int, state: CheckpointState, batch: int | None, query: str | None = "q1") -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="p",
        checkpoint_id=cid,
        state=state,
        lineage=1,
        ranges=R,
        planned_at=T0,
        query_id=query,
        batch_id=batch,
    )


C, P, PL = CheckpointState.COMMITTED, CheckpointState.PREPARED, CheckpointState.PLANNED


def pos(batch: int, query: str = "q1", ranges: tuple[RangeSpec, ...] = R) -> BatchPosition:
    return BatchPosition(query, batch, ranges)


def test_first_batch_is_planned() -> None:
    assert decide("p", None, pos(0), allow_new_query=False)[0] == "plan"


@pytest.mark.parametrize(
    ("newest", "batch", "action"),
    [
        (cp(4, C, 7), 7, "skip"),  # re-run after the ledger committed, before Spark's commit log
        (cp(4, C, 7), 6, "skip"),  # below the newest batch: published before
        (cp(4, P, 7), 7, "commit"),  # staged by the first run: publish that, not the re-run's frame
        (cp(4, PL, 7), 7, "stage"),  # died before staging
        (cp(4, C, 7), 8, "plan"),
        (cp(4, P, 7), 8, "commit_previous"),
        (cp(4, P, 7), 6, "skip"),
    ],
)
def test_a_batch_against_the_newest_checkpoint(newest: CheckpointRecord, batch: int, action: str) -> None:
    assert decide("p", newest, pos(batch), allow_new_query=False)[0] == action


def test_a_rerun_with_other_ranges_or_a_skipped_plan_is_refused() -> None:
    with pytest.raises(BatchOutOfStep, match=r"src\[0\] \[10, 21\)"):
        decide("p", cp(4, PL, 7), pos(7, ranges=(RangeSpec("src", 0, 10, 21), R[1])), allow_new_query=False)
    with pytest.raises(BatchOutOfStep, match="eo abort p 4"):
        decide("p", cp(4, PL, 7), pos(8), allow_new_query=False)


def test_another_query_under_the_name_is_refused_unless_allowed() -> None:
    with pytest.raises(QueryIdentityMismatch, match="written by query q1"):
        decide("p", cp(4, C, 7), pos(0, query="q2"), allow_new_query=False)
    after = tuple(RangeSpec(r.topic, r.partition, r.end, r.end + 3) for r in R)  # from q1's ends
    assert decide("p", cp(4, C, 7), pos(0, query="q2", ranges=after), allow_new_query=True)[0] == "plan"
    with pytest.raises(BatchOutOfStep, match="previous query q1 is PREPARED"):
        decide("p", cp(4, P, 7), pos(0, query="q2"), allow_new_query=True)
    with pytest.raises(QueryIdentityMismatch, match="planned by eo itself"):
        decide("p", cp(4, C, None, query=None), pos(0), allow_new_query=True)


# The same query's batch 3 as another offset log says it (a checkpoint location restored from
# an older copy that re-planned the batch, or one whose query id was taken for another's).
OTHER = (RangeSpec("src", 0, 0, 20), RangeSpec("src", 1, 0, 9))


@pytest.mark.parametrize("newest", [cp(4, C, 7), cp(4, P, 7)])
def test_a_batch_the_ledger_holds_with_other_ranges_is_refused_never_skipped(
    newest: CheckpointRecord,
) -> None:
    recorded = cp(2, C, 3)
    with pytest.raises(BatchOutOfStep) as refused:
        decide("p", newest, pos(3, ranges=OTHER), allow_new_query=False, recorded=recorded)
    message = str(refused.value)
    for part in ("pipeline 'p'", "query q1", "batch 3", "checkpoint 2", "src[0] [10, 20)", "src[0] [0, 20)"):
        assert part in message, message
    # The same batch as the ledger recorded it is a replay: skipped.
    assert decide("p", newest, pos(3), allow_new_query=False, recorded=recorded)[0] == "skip"


@pytest.mark.parametrize("state", [C, P])
def test_the_newest_batch_rerun_with_other_ranges_is_refused(state: CheckpointState) -> None:
    with pytest.raises(BatchOutOfStep, match=r"src\[0\] \[0, 20\)"):
        decide("p", cp(4, state, 7), pos(7, ranges=OTHER), allow_new_query=False)


def test_an_unrecorded_batch_below_the_newest_is_skipped_only_when_the_ledger_covers_it() -> None:
    # Batch 5 was aborted (no live checkpoint holds it): its ranges end within the newest's.
    assert decide("p", cp(4, C, 7), pos(5), allow_new_query=False)[0] == "skip"
    beyond = (RangeSpec("src", 0, 10, 25), R[1])  # offsets 20..24 no checkpoint published
    with pytest.raises(BatchOutOfStep, match=r"src\[0\] \[10, 25\)"):
        decide("p", cp(4, C, 7), pos(5, ranges=beyond), allow_new_query=False)
    unknown = (*R, RangeSpec("src", 2, 0, 3))  # a partition the ledger never recorded
    with pytest.raises(BatchOutOfStep, match=r"src\[2\] \[0, 3\)"):
        decide("p", cp(4, C, 7), pos(5, ranges=unknown), allow_new_query=False)


def test_a_new_query_allowed_in_continues_only_from_the_old_ones_ends() -> None:
    # Started from the source's earliest offsets: it would publish what q1 published.
    with pytest.raises(QueryIdentityMismatch) as refused:
        decide("p", cp(4, C, 7), pos(0, query="q2", ranges=OTHER), allow_new_query=True)
    message = str(refused.value)
    for part in (
        "query q2, batch 0",
        "where query q1 ended",
        "src[0] [0, 20)",
        'startingOffsets={"src":{"0":20,"1":9}}',
    ):
        assert part in message, message
