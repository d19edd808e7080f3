"""The commit plan a checkpoint is published with (docs/design.md §2): built and frozen with
the checkpoint in the one ledger write that plans it, checked before every use.

Every planner ends here: the live offsets (core/plan.py), a Structured Streaming batch
(core/batches.py) and a backfill's stored ranges (core/backfill.py) each start with
:func:`pinned_prefix` (or the backfill's own registration), read the sink's partitions
(:func:`sink_partitions`) and record their ranges with :func:`record_planned`; prepare and
commit take the frozen plan through :func:`frozen_commit_plan`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from airflow_provider_eo import names
from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Actor, CheckpointRecord, CommitPlan, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline

log = logging.getLogger(__name__)


def pinned_prefix(pipeline: Pipeline, ledger: Ledger, *, where: str) -> str:
    """The start of every plan: ``pipeline``'s connections applied (``where`` names the
    step in the error), the pipeline registered (its fingerprint checked) and its
    transactional-id prefix pinned by its first plan, then checked: one transactional-id
    namespace per pipeline."""
    require_applied(pipeline, where=where)
    ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    return ledger.pin_transactional_id_prefix(pipeline.name, pipeline.transactional_id_prefix)


def sink_partitions(
    pipeline: Pipeline, topic: str | None = None, *, clients: KafkaClients | None = None
) -> int:
    """The partition count of ``topic`` (default: the pipeline's sink topic); a missing
    topic fails here, before anything is planned."""
    clients = kafka_clients(pipeline.kafka, clients)
    return clients.partition_count(topic or pipeline.sink_topic)


def record_planned(
    pipeline: Pipeline,
    ledger: Ledger,
    ranges: Sequence[RangeSpec],
    *,
    prefix: str,
    partitions: int,
    max_pending: int,
    actor: Actor | None = None,
    details: dict[str, object] | None = None,
    batch: tuple[str, int] | None = None,
    time_filter: tuple[int, int] | None = None,
) -> CheckpointRecord:
    """Record the next checkpoint PLANNED over ``ranges`` with its commit plan (``partitions``
    sink partitions, transactional ids under ``prefix``), frozen in the same ledger write:
    every commit try uses it, never the settings of the day. ``batch``: the Structured
    Streaming (query id, batch id) it records; ``time_filter``: a backfill checkpoint's
    ``[start_ms, end_ms)`` (the ledger then refuses ranges another backfill checkpoint reads).
    """
    commit_plan = names.commit_plan(pipeline, partitions, prefix)
    if time_filter is not None:
        return ledger.plan_backfill(
            pipeline.name,
            list(ranges),
            filter_start_ms=time_filter[0],
            filter_end_ms=time_filter[1],
            max_pending=max_pending,
            actor=actor,
            details=details,
            commit_plan=commit_plan,
        )
    return ledger.plan(
        pipeline.name,
        list(ranges),
        max_pending=max_pending,
        actor=actor,
        details=details,
        commit_plan=commit_plan,
        batch=batch,
    )


def check_commit_plan(
    pipeline: Pipeline, cp: CheckpointRecord, plan: CommitPlan, *, clients: KafkaClients | None = None
) -> None:
    """Refuse a frozen commit plan the cluster can no longer carry out; say when the
    settings moved on (they apply from the next checkpoint).

    1. The plan's sink topic has fewer partitions than the plan (the topic was re-created):
       the staged output cannot be placed, so nothing may be published. Refused (ConfigError)
       naming the topic and both counts; the checkpoint is left as it is.
    2. More partitions than the plan: fine, the checkpoint publishes on the plan's.
    3. ``sink_topic`` renamed since the plan: the checkpoint still goes to its frozen sink
       (logged); the new topic is used from the next checkpoint.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    live = clients.partition_count(plan.sink_topic)
    if live < plan.sink_partitions:
        raise ConfigError(
            f"pipeline {pipeline.name!r}, checkpoint {cp.checkpoint_id}: sink_topic "
            f"{plan.sink_topic!r} now has {live} partitions, but the checkpoint's commit plan "
            f"(frozen when it was planned) places its output on {plan.sink_partitions} "
            "partitions. The staged output cannot be placed, so nothing was published and the "
            f"checkpoint stays {cp.state.value}. Was the topic re-created? Give "
            f"{plan.sink_topic!r} {plan.sink_partitions} partitions again (kafka-topics --alter "
            f"--partitions {plan.sink_partitions}) and retry, or abort checkpoint "
            f"{cp.checkpoint_id} so its range is replanned for the topic as it is now."
        )
    if plan.sink_topic != pipeline.sink_topic:
        log.warning(
            "pipeline %r, checkpoint %d: publishing to its frozen sink_topic %r (the setting is "
            "now %r, used from the next checkpoint)",
            pipeline.name,
            cp.checkpoint_id,
            plan.sink_topic,
            pipeline.sink_topic,
        )


def frozen_commit_plan(
    pipeline: Pipeline,
    ledger: Ledger,
    cp: CheckpointRecord,
    *,
    staged_partitions: int | None = None,
    actor: Actor | None = None,
    clients: KafkaClients | None = None,
) -> CommitPlan:
    """The commit plan checkpoint ``cp`` is published with, checked (:func:`check_commit_plan`).

    First pins (or checks) the pipeline's transactional-id prefix: a process configured with
    another one is refused before anything else. A checkpoint planned before ledger revision
    0002 has no plan yet: one is made from today's settings and frozen in the ledger (the
    first caller's wins); ``staged_partitions``, when the output is already staged, is the
    partition count it was staged for.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    prefix = ledger.pin_transactional_id_prefix(pipeline.name, pipeline.transactional_id_prefix)
    plan = cp.commit_plan
    if plan is None:
        count = staged_partitions
        if count is None:
            count = clients.partition_count(pipeline.sink_topic)
        frozen = ledger.freeze_commit_plan(
            pipeline.name, cp.checkpoint_id, names.commit_plan(pipeline, count, prefix), actor=actor
        )
        assert frozen.commit_plan is not None  # freeze_commit_plan raises otherwise
        plan = frozen.commit_plan
    check_commit_plan(pipeline, cp, plan, clients=clients)
    return plan
