"""One pipeline name, two deployments: two ledgers (staging and production pointed at one
Kafka cluster by mistake, or two teams choosing the same name), two sink topics, ONE shared
``staging_dir``. They would share transactional ids (each one's ``init_transactions`` fences
the other's open transaction) and the default consumer group (each moves the other's
source offsets). The second one is refused with ``PipelineNameInUse`` once the first has
committed: at its plan, or at its commit when both planned before either committed; the
first runs on exactly once, counted against the source, and the shared staging folder keeps
each one's attempts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eo_harness import Harness
from eo_source_sink import assert_sink_is_source_exactly_once

from airflow_provider_eo import names, staging
from airflow_provider_eo.errors import PipelineNameInUse
from airflow_provider_eo.kafka.audit import read_sink, settled_ends
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _second(a: Harness, make_topic: Callable[..., str], tmp_path: Path) -> Harness:
    """The same pipeline name with its own ledger and sink topic, staging where ``a`` does."""
    pipeline = replace(
        a.pipeline,
        ledger_url=f"sqlite:///{tmp_path / 'ledger-b.db'}",
        sink_topic=make_topic("sink-b", partitions=2),
    )
    assert pipeline.staging_dir == a.pipeline.staging_dir and pipeline.name == a.pipeline.name
    return Harness(pipeline, a.config, a.spark)


def _sink_ends(h: Harness) -> dict[tuple[str, int], int]:
    return settled_ends(h.config, [(h.pipeline.sink_topic, p) for p in (0, 1)])


def _describe_run(h: Harness, result: Any) -> str:
    cp = result.checkpoint
    state = "nothing" if cp is None else f"checkpoint {cp.checkpoint_id} {cp.state.value}"
    return f"{state}, {len(read_sink(h.config, h.pipeline.sink_topic))} records in its sink"


def test_the_second_deployment_is_refused_at_plan_and_the_first_runs_on_exactly_once(
    harness: Callable[..., Any], make_topic: Callable[..., str], tmp_path: Path
) -> None:
    a = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=500)
    b = _second(a, make_topic, tmp_path)
    try:
        a.produce(1500)
        assert a.run_once().checkpoint.checkpoint_id == 1  # A has committed a checkpoint
        # A's next checkpoint waits PREPARED in the shared staging folder while B tries.
        assert a.plan().checkpoint_id == 2
        a.prepare(2)
        attempt_a = Path(a.ledger.get(a.pipeline.name, 2).staging_location or "")
        identity_a = a.ledger.get_pipeline(a.pipeline.name).identity

        try:
            ran = b.run_once()
        except PipelineNameInUse as exc:
            refused = exc
        else:
            pytest.fail(f"the second deployment ran: {_describe_run(b, ran)}")
        text = str(refused)
        assert f"pipeline {a.pipeline.name!r}" in text and identity_a in text, text
        assert repr(a.pipeline.sink_topic) in text and repr(b.pipeline.sink_topic) in text, text
        assert "no data is at risk" in text and "another pipeline name" in text, text
        assert (
            f"--delete-offsets --group {names.marker_group(a.pipeline)} --topic {a.pipeline.sink_topic}"
            in text
        ), text
        cli = b.cli("run-once")
        assert cli.returncode == 1, cli.stdout + cli.stderr
        assert "is also run by another deployment" in " ".join(cli.stderr.split()), cli.stderr
        assert b.ledger.list_checkpoints(b.pipeline.name) == []  # nothing planned
        assert all(end == 0 for end in _sink_ends(b).values())  # nothing published

        # B's cleanup of its checkpoint 2 (what its commit would run) in the shared folder
        # leaves A's prepared attempt alone: the manifest names A's ledger.
        identity_b = b.ledger.get_pipeline(b.pipeline.name).identity
        assert identity_b != identity_a
        staging.remove_checkpoint_attempts(names.checkpoint_dir(b.pipeline, 2), identity_b, None)
        assert (attempt_a / names.MANIFEST).is_file()

        # A runs on: its prepared checkpoint commits, the rest drains, exactly once.
        a.commit(2)
        a.drain()
        assert_sink_is_source_exactly_once(a.config, a.pipeline, source_records=1500)
        a.assert_exactly_once(expected_records=1500)
        with pytest.raises(PipelineNameInUse):
            b.plan()
        assert all(end == 0 for end in _sink_ends(b).values())
    finally:
        b.ledger.close()


def test_two_deployments_that_planned_before_either_committed(
    harness: Callable[..., Any], make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Neither plan can see the other (no marker exists yet). Both stage checkpoint 1 in the
    one shared checkpoint folder; A commits first, and its cleanup keeps B's attempt. B's
    commit is then refused before it produces anything; A runs on exactly once."""
    a = harness(source_partitions=2, sink_partitions=2)
    b = _second(a, make_topic, tmp_path)
    try:
        a.produce(600)
        assert a.plan().checkpoint_id == b.plan().checkpoint_id == 1
        a.prepare(1)
        b.prepare(1)
        attempt_a = Path(a.ledger.get(a.pipeline.name, 1).staging_location or "")
        attempt_b = Path(b.ledger.get(b.pipeline.name, 1).staging_location or "")
        assert attempt_a.parent == attempt_b.parent and attempt_a != attempt_b  # one shared folder

        a.commit(1)
        assert not attempt_a.exists() and (attempt_b / names.MANIFEST).is_file()
        try:
            done = b.commit(1)
        except PipelineNameInUse as exc:
            assert repr(a.pipeline.sink_topic) in str(exc), str(exc)
        else:
            pytest.fail(
                f"the second deployment committed checkpoint 1: {done.published} records, "
                f"{len(read_sink(b.config, b.pipeline.sink_topic))} in its sink"
            )
        assert b.ledger.get(b.pipeline.name, 1).state is CheckpointState.PREPARED
        with pytest.raises(PipelineNameInUse):
            b.run_once()  # resumes its checkpoint 1: refused again
        assert all(end == 0 for end in _sink_ends(b).values())

        a.produce(400, start=600)
        a.drain()
        assert_sink_is_source_exactly_once(a.config, a.pipeline, source_records=1000)
        a.assert_exactly_once(expected_records=1000)
    finally:
        b.ledger.close()
