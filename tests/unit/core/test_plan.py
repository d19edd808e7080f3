"""Planning logic: fair capping of offset ranges, the commit plan a checkpoint freezes, the
one check before an unfinished checkpoint is continued (Kafka faked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from eo_fake_kafka import fake_pipeline
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_eo import names
from airflow_provider_eo.core import plan as core_plan
from airflow_provider_eo.core.plan import cap_ranges
from airflow_provider_eo.errors import DataLossError
from airflow_provider_eo.ledger import CheckpointState, CommitPlan, Ledger, RangeSpec
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


# -- the one check before an unfinished checkpoint is continued --------------------------------


@pytest.fixture
def resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Pipeline, Ledger, list[str]]]:
    """A pipeline with one PLANNED checkpoint (frozen commit plan) in a SQLite ledger; the
    Kafka lookups faked: ``lost`` is what ``lost_ranges`` answers; each commit-plan check is
    written down in the list returned third."""
    pipeline = fake_pipeline(tmp_path, sink="out", shards=1)
    checked: list[str] = []
    monkeypatch.setattr(core_plan, "lost_ranges", lambda p, ranges: list(LOST))
    monkeypatch.setattr(core_plan, "check_commit_plan", lambda p, cp, plan: checked.append(p.name))
    monkeypatch.setattr(
        core_plan,
        "abort_checkpoint",
        lambda p, led, cid, *, reason, actor: led.abort(p.name, cid, reason=reason, actor=actor),
    )
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 10)], commit_plan=names.commit_plan(pipeline, 1))
        yield pipeline, ledger, checked


LOST: list[str] = []


def test_a_resumable_checkpoint_is_returned_with_its_commit_plan_checked(
    resumable: tuple[Pipeline, Ledger, list[str]],
) -> None:
    pipeline, ledger, checked = resumable
    LOST[:] = []
    cp = core_plan.resume_unfinished(pipeline, ledger, ledger.get(pipeline.name, 1))
    assert cp is not None and cp.checkpoint_id == 1 and checked == ["orders"]


def test_lost_planned_offsets_fail_by_name_or_are_skipped_by_the_setting(
    resumable: tuple[Pipeline, Ledger, list[str]],
) -> None:
    pipeline, ledger, checked = resumable
    LOST[:] = ["in[0] [0, 10) (log starts at 12)"]
    cp = ledger.get(pipeline.name, 1)
    with pytest.raises(DataLossError, match=r"checkpoint 1: its planned offsets .*in\[0\] \[0, 10\)"):
        core_plan.resume_unfinished(pipeline, ledger, cp)
    # A caller that never skips (a backfill) gets its own error even under 'skip'.
    skipping = dataclasses.replace(pipeline, on_data_loss="skip")
    with pytest.raises(RuntimeError, match="backfill never skips"):
        core_plan.resume_unfinished(
            skipping,
            ledger,
            cp,
            may_skip=False,
            lost_error=lambda p, c, lost: RuntimeError("backfill never skips"),
        )
    assert ledger.get(pipeline.name, 1).state is CheckpointState.PLANNED and checked == []
    assert core_plan.resume_unfinished(skipping, ledger, cp) is None
    aborted = ledger.get(pipeline.name, 1)
    assert aborted.state is CheckpointState.ABORTED and "planned offsets deleted" in (
        aborted.abort_reason or ""
    )


def test_a_prepared_checkpoints_ranges_are_not_looked_at(
    resumable: tuple[Pipeline, Ledger, list[str]],
) -> None:
    pipeline, ledger, checked = resumable
    LOST[:] = ["in[0] [0, 10)"]
    cp = ledger.mark_prepared(
        pipeline.name, 1, attempt="a", staging_location="/x", records=10, bytes_=10, shard_counts={0: 10}
    )
    assert core_plan.resume_unfinished(pipeline, ledger, cp) == cp and checked == ["orders"]
