"""Planning logic: fair capping of offset ranges, the commit plan a checkpoint freezes, the
one check before an unfinished checkpoint is continued (Kafka faked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, fake_pipeline
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_eo import names
from airflow_provider_eo.core import plan as core_plan
from airflow_provider_eo.core.plan import cap_ranges
from airflow_provider_eo.errors import ConfigError, DataLossError
from airflow_provider_eo.ledger import CheckpointState, CommitPlan, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline, Startup


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
) -> Iterator[tuple[Pipeline, Ledger, FakeBroker, FakeClients]]:
    """A pipeline with one PLANNED checkpoint of ``in[0]`` [0, 10) (its commit plan frozen
    for a 1-partition sink ``out``) in a SQLite ledger, and a fake cluster where ``in[0]``
    holds offsets [0, 20). An abort here is the ledger's (nothing was published)."""
    pipeline = fake_pipeline(tmp_path, sink="out", shards=1)
    broker = FakeBroker(partitions={"out": 1}, logs={("in", 0): (0, 20)})
    monkeypatch.setattr(
        core_plan,
        "abort_checkpoint",
        lambda p, led, cid, *, reason, actor: led.abort(p.name, cid, reason=reason, actor=actor),
    )
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 10)], commit_plan=names.commit_plan(pipeline, 1))
        yield pipeline, ledger, broker, FakeClients(broker)


def test_a_resumable_checkpoint_is_returned_with_its_commit_plan_checked(
    resumable: tuple[Pipeline, Ledger, FakeBroker, FakeClients],
) -> None:
    pipeline, ledger, broker, clients = resumable
    cp = core_plan.resume_unfinished(pipeline, ledger, ledger.get(pipeline.name, 1), clients=clients)
    assert cp is not None and cp.checkpoint_id == 1
    broker.partitions["out"] = 0  # the sink re-created smaller: the frozen plan is refused now
    with pytest.raises(ConfigError, match="now has 0 partitions"):
        core_plan.resume_unfinished(pipeline, ledger, cp, clients=clients)


def test_lost_planned_offsets_fail_by_name_or_are_skipped_by_the_setting(
    resumable: tuple[Pipeline, Ledger, FakeBroker, FakeClients],
) -> None:
    pipeline, ledger, broker, clients = resumable
    broker.logs[("in", 0)] = (12, 20)  # retention deleted offsets 0-11
    cp = ledger.get(pipeline.name, 1)
    with pytest.raises(DataLossError, match=r"checkpoint 1: its planned offsets .*in\[0\]: \[0, 10\)"):
        core_plan.resume_unfinished(pipeline, ledger, cp, clients=clients)
    # A caller that never skips (a backfill) gets its own error even under 'skip'.
    skipping = dataclasses.replace(pipeline, on_data_loss="skip")
    with pytest.raises(RuntimeError, match="backfill never skips"):
        core_plan.resume_unfinished(
            skipping,
            ledger,
            cp,
            may_skip=False,
            lost_error=lambda p, c, lost: RuntimeError("backfill never skips"),
            clients=clients,
        )
    assert ledger.get(pipeline.name, 1).state is CheckpointState.PLANNED
    assert core_plan.resume_unfinished(skipping, ledger, cp, clients=clients) is None
    aborted = ledger.get(pipeline.name, 1)
    assert aborted.state is CheckpointState.ABORTED
    assert "deleted before prepare: in[0]: [0, 10) (below the log start 12)" in (aborted.abort_reason or "")


def test_a_prepared_checkpoints_ranges_are_not_looked_at(
    resumable: tuple[Pipeline, Ledger, FakeBroker, FakeClients],
) -> None:
    pipeline, ledger, broker, clients = resumable
    broker.logs[("in", 0)] = (12, 20)  # gone, but the output is staged already
    cp = ledger.mark_prepared(
        pipeline.name, 1, attempt="a", staging_location="/x", records=10, bytes_=10, shard_counts={0: 10}
    )
    assert core_plan.resume_unfinished(pipeline, ledger, cp, clients=clients) == cp
    assert not any(call.startswith("list_offsets") for _tid, call in broker.calls)


# -- planning through the fake clients: where ranges start and end ------------------------------


def _plan(pipeline: Pipeline, ledger: Ledger, broker: FakeBroker) -> Any:
    return core_plan.plan_checkpoint(pipeline, ledger, clients=FakeClients(broker))


@pytest.fixture
def planning(tmp_path: Path) -> Iterator[tuple[Pipeline, Ledger, FakeBroker]]:
    """A new pipeline over ``in`` (two partitions: [5, 50) and [0, 7)) and a 1-partition sink
    ``out`` with nothing in it, on a fake cluster; its ledger on SQLite."""
    pipeline = fake_pipeline(tmp_path, sink="out", shards=1)
    broker = FakeBroker(partitions={"out": 1}, logs={("in", 0): (5, 50), ("in", 1): (0, 7)})
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        yield pipeline, ledger, broker


def _ranges(cp: Any) -> dict[tuple[str, int], tuple[int, int]]:
    return {(r.topic, r.partition): (r.start, r.end) for r in cp.ranges}


def test_the_first_plan_starts_by_the_startup_policy_and_ends_at_the_last_stable_offset(
    planning: tuple[Pipeline, Ledger, FakeBroker],
) -> None:
    pipeline, ledger, broker = planning
    cp = _plan(pipeline, ledger, broker)
    assert _ranges(cp) == {("in", 0): (5, 50), ("in", 1): (0, 7)}
    assert _plan(pipeline, ledger, broker).checkpoint_id == cp.checkpoint_id  # unfinished: resumed


def test_a_group_start_takes_the_groups_offsets_and_the_fallback_elsewhere(
    planning: tuple[Pipeline, Ledger, FakeBroker],
) -> None:
    pipeline, ledger, broker = planning
    grouped = dataclasses.replace(pipeline, startup=Startup(mode="group", fallback="latest"))
    broker.groups[grouped.group_id] = {("in", 0): 30}
    assert _ranges(_plan(grouped, ledger, broker)) == {("in", 0): (30, 50), ("in", 1): (7, 7)}


def test_a_partition_found_later_starts_at_its_earliest_offset_and_the_plan_says_so(
    planning: tuple[Pipeline, Ledger, FakeBroker],
) -> None:
    pipeline, ledger, broker = planning
    latest = dataclasses.replace(pipeline, startup=Startup(mode="latest"))
    first = _plan(latest, ledger, broker)
    assert _ranges(first) == {("in", 0): (50, 50), ("in", 1): (7, 7)}
    finish(latest, ledger, first.checkpoint_id)
    broker.logs[("in", 2)] = (0, 4)  # the topic grew
    cp = _plan(latest, ledger, broker)
    assert _ranges(cp)[("in", 2)] == (0, 4)  # not "latest": its records came after the start
    (event,) = [e for e in ledger.events("orders", cp.checkpoint_id) if e.to_state is CheckpointState.PLANNED]
    assert event.details["discovered"] == {"in[2]": {"start": 0, "policy": "earliest"}}


def test_offsets_deleted_before_they_were_read_fail_or_are_skipped_by_the_setting(
    planning: tuple[Pipeline, Ledger, FakeBroker],
) -> None:
    pipeline, ledger, broker = planning
    first = _plan(pipeline, ledger, broker)
    finish(pipeline, ledger, first.checkpoint_id)
    broker.logs[("in", 0)] = (60, 80)  # retention passed the pipeline's next start (50)
    with pytest.raises(DataLossError, match=r"offsets \[50, 60\) of in\[0\] were deleted by retention"):
        _plan(pipeline, ledger, broker)
    skipping = dataclasses.replace(pipeline, on_data_loss="skip")
    cp = _plan(skipping, ledger, broker)
    (lost,) = [r for r in cp.ranges if r.partition == 0]
    assert (lost.skipped_from, lost.start, lost.end) == (50, 60, 80)


def finish(pipeline: Pipeline, ledger: Ledger, checkpoint_id: int) -> None:
    """Make a planned checkpoint COMMITTED in the ledger only (its publishing is not tested
    here): prepared with nothing staged, its shard recorded committed."""
    ledger.mark_prepared(
        pipeline.name, checkpoint_id, attempt="a", staging_location="/x", records=0, bytes_=0, shard_counts={}
    )
    ledger.record_shard(
        pipeline.name,
        checkpoint_id,
        0,
        transactional_id="eo.orders.0",
        producer_id=None,
        producer_epoch=None,
        state="COMMITTED",
        records=0,
    )
    ledger.mark_committed(pipeline.name, checkpoint_id)
