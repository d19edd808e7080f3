"""Pure planning logic: fair capping of offset ranges, the commit plan a checkpoint freezes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_eo import names
from airflow_provider_eo.core.plan import cap_ranges
from airflow_provider_eo.ledger import CommitPlan
from airflow_provider_eo.pipeline import Pipeline


def test_small_partitions_take_everything_large_ones_split_the_rest() -> None:
    starts = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    ends = {("t", 0): 10, ("t", 1): 1100, ("t", 2): 1005}
    capped = cap_ranges(starts, ends, 410)
    assert capped == {("t", 0): 10, ("t", 1): 300, ("t", 2): 205}


def test_budget_larger_than_data_takes_all() -> None:
    starts = {("t", 0): 3}
    ends = {("t", 0): 9}
    assert cap_ranges(starts, ends, 1000) == ends


@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=12),
    st.integers(1, 50_000),
)
def test_never_exceeds_budget_or_data(spans: list[tuple[int, int]], budget: int) -> None:
    starts = {("t", i): s for i, (s, _) in enumerate(spans)}
    ends = {("t", i): s + n for i, (s, n) in enumerate(spans)}
    capped = cap_ranges(starts, ends, budget)
    taken = sum(capped[tp] - starts[tp] for tp in starts)
    assert all(starts[tp] <= capped[tp] <= ends[tp] for tp in starts)
    assert taken == min(budget, sum(n for _, n in spans))


def _pipeline(**kw: object) -> Pipeline:
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "localhost:9"},
        source_topics=["in"],
        sink_topic="out",
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("shards", "partitions", "expected"),
    [(1, 3, (0, 0, 0)), (3, 3, (0, 1, 2)), (3, 2, (0, 1)), (2, 5, (0, 1, 0, 1, 0))],
)
def test_commit_plan_uses_todays_rules(shards: int, partitions: int, expected: tuple[int, ...]) -> None:
    plan = names.commit_plan(_pipeline(commit_shards=shards), partitions, "pinned")
    assert plan.shard_of_partition == expected
    assert plan.shards == min(shards, partitions)
    assert (plan.sink_topic, plan.sink_partitions) == ("out", partitions)
    assert plan.marker_group == "eo-marker.orders"
    assert plan.transactional_id_prefix == "pinned"
    assert names.plan_transactional_id(plan, "orders", 1) == "pinned.orders.1"
    assert sorted(p for s in range(plan.shards) for p in plan.partitions_of(s)) == list(range(partitions))
    assert CommitPlan.from_json(plan.to_json()) == plan


def test_commit_plan_defaults_to_the_configured_prefix() -> None:
    plan = names.commit_plan(_pipeline(transactional_id_prefix="acme"), 2)
    assert plan.transactional_id_prefix == "acme"
    assert names.plan_transactional_id(plan, "orders", 0) == "acme.orders.0"
