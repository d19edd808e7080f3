"""Pure restore/reset logic: parsing ``--to``, the savepoint/topic partition diff, bounds."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_eo.core.restore import (
    RestoreResult,
    nested,
    out_of_range,
    parse_reset_target,
    partition_diff,
)
from airflow_provider_eo.errors import ConfigError


def test_earliest_and_latest() -> None:
    assert parse_reset_target("earliest").kind == "earliest"
    assert parse_reset_target(" latest ").kind == "latest"


def test_timestamp_with_zone_without_zone_is_utc_and_z() -> None:
    utc = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    ms = int(utc.timestamp() * 1000)
    assert parse_reset_target("timestamp=2024-05-01T00:00:00Z").timestamp_ms == ms
    assert parse_reset_target("timestamp=2024-05-01T00:00:00").timestamp_ms == ms
    assert parse_reset_target("timestamp=2024-05-01T02:00:00+02:00").timestamp_ms == ms
    assert (
        parse_reset_target("timestamp=2024-05-01T00:00:00Z").describe()
        == "timestamp=2024-05-01T00:00:00+00:00"
    )


def test_offsets_json() -> None:
    target = parse_reset_target('offsets={"orders": {"0": 42, "1": 7}, "b": {"3": 0}}')
    assert target.kind == "offsets"
    assert target.offsets == {"orders": {0: 42, 1: 7}, "b": {3: 0}}
    assert target.describe() == 'offsets={"b": {"3": 0}, "orders": {"0": 42, "1": 7}}'


@pytest.mark.parametrize(
    ("to", "match"),
    [
        ("newest", "not understood"),
        ("", "not understood"),
        ("timestamp=yesterday", "not an ISO-8601 time"),
        ("timestamp=1900-01-01T00:00:00Z", "before 1970"),
        ("offsets={", "not valid JSON"),
        ("offsets=[]", "non-empty object"),
        ("offsets={}", "non-empty object"),
        ('offsets={"t": 3}', "topic 't' needs a non-empty object"),
        ('offsets={"t": {}}', "topic 't' needs a non-empty object"),
        ('offsets={"t": {"x": 3}}', "partition 'x' of 't' is not a number"),
        ('offsets={"t": {"0": -1}}', r"t\[0\] needs a partition >= 0"),
        ('offsets={"t": {"-1": 1}}', r"t\[-1\] needs a partition >= 0"),
        ('offsets={"t": {"0": 1.5}}', "whole"),
        ('offsets={"t": {"0": true}}', "whole"),
        ('offsets={"t": {"0": "5"}}', "whole"),
    ],
)
def test_bad_targets_say_what_is_accepted(to: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_reset_target(to)
    assert "earliest" in str(info.value) or "partition" in str(info.value) or "whole" in str(info.value)


def test_partition_diff() -> None:
    saved = [("a", 0), ("a", 1), ("gone", 0)]
    current = [("a", 0), ("a", 1), ("a", 2), ("new", 0)]
    assert partition_diff(saved, current) == ([("gone", 0)], [("a", 2), ("new", 0)])
    assert partition_diff(current, current) == ([], [])


def test_out_of_range_names_each_partition() -> None:
    start = {("t", 0): 10, ("t", 1): 0, ("t", 2): 0}
    end = {("t", 0): 50, ("t", 1): 5, ("t", 2): 5}
    problems = out_of_range({("t", 0): 3, ("t", 1): 9, ("t", 2): 5}, start, end)
    assert len(problems) == 2
    assert problems[0].startswith("t[0]: offset 3 is below the log start 10")
    assert problems[1].startswith("t[1]: offset 9 is above the log end 5")
    assert out_of_range({("t", 0): 10, ("t", 1): 5}, start, end) == []


def test_result_summary_is_json_ready() -> None:
    result = RestoreResult("p", 3, nested({("t", 1): 4, ("t", 0): 2}), "why", {"vanished": ["x[0]"]})
    assert result.summary() == {
        "pipeline": "p",
        "lineage": 3,
        "offsets": {"t": {"0": 2, "1": 4}},
        "reason": "why",
        "non_restored": {"vanished": ["x[0]"]},
        "repeated": False,
    }
