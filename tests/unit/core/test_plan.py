"""Pure planning logic: fair capping of offset ranges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_eo.core.plan import cap_ranges


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
