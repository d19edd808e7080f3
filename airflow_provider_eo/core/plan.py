"""Plan (or resume) a pipeline's next checkpoint: an exact offset range per partition."""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_eo.core.commit import check_marker_identity
from airflow_provider_eo.errors import DataLossError, SourceError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import Actor, CheckpointRecord, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline

TP = tuple[str, int]


def startup_offsets(pipeline: Pipeline, partitions: list[TP]) -> dict[TP, int]:
    """Where partitions the ledger has never seen start, by the pipeline's startup policy."""
    if not partitions:
        return {}
    config = librdkafka_config(pipeline.kafka)
    mode = pipeline.startup.mode
    if mode == "earliest":
        return admin.list_offsets(config, partitions, spec="earliest")
    if mode == "latest":
        return admin.list_offsets(config, partitions, spec="latest")
    if mode == "timestamp":
        assert pipeline.startup.timestamp_ms is not None
        return admin.offsets_for_timestamp(config, partitions, pipeline.startup.timestamp_ms)
    if mode == "offsets":
        given = pipeline.startup.offsets or {}
        out: dict[TP, int] = {}
        rest: list[TP] = []
        for topic, partition in partitions:
            if partition in given.get(topic, {}):
                out[(topic, partition)] = int(given[topic][partition])
            else:
                rest.append((topic, partition))
        if rest:  # partitions not named start by the fallback
            out.update(admin.list_offsets(config, rest, spec=pipeline.startup.fallback))
        return out
    # group: the consumer group's committed offsets, else the fallback
    committed = admin.committed_group_offsets(config, pipeline.group_id, partitions)
    missing = [tp for tp in partitions if tp not in committed]
    if missing:
        committed.update(admin.list_offsets(config, missing, spec=pipeline.startup.fallback))
    return committed


def cap_ranges(starts: Mapping[TP, int], ends: Mapping[TP, int], budget: int) -> dict[TP, int]:
    """New ends so the total planned offsets stay within ``budget``, shared fairly
    (water-filling: partitions with little data take all of it, the rest split the remainder)."""
    avail = {tp: max(0, ends[tp] - starts[tp]) for tp in starts}
    order = sorted(avail, key=lambda tp: (avail[tp], tp))
    take: dict[TP, int] = {}
    remaining = budget
    for i, tp in enumerate(order):
        share = remaining // (len(order) - i)
        take[tp] = min(avail[tp], share)
        remaining -= take[tp]
    return {tp: starts[tp] + take[tp] for tp in starts}


def plan_checkpoint(
    pipeline: Pipeline, ledger: Ledger, *, actor: Actor | None = None
) -> CheckpointRecord | None:
    """Return the pipeline's unfinished checkpoint, else plan the next one.

    Idempotent per run: while a checkpoint is unfinished, every call returns it (this is
    restart-from-checkpoint). Returns ``None`` when there is nothing new to read.
    """
    registered = ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
    unfinished = ledger.unfinished(pipeline.name)
    if unfinished is not None:
        return unfinished
    # Markers written by another ledger (re-created, or a second deployment with this name)
    # are refused before anything is planned against them (issue 11, hole 4).
    check_marker_identity(pipeline, registered.identity)
    config = librdkafka_config(pipeline.kafka)
    topics = admin.partitions_of(config, pipeline.source_topics)
    admin.partitions_of(config, [pipeline.sink_topic])  # a missing sink fails before planning
    partitions = [(t, p) for t, ps in sorted(topics.items()) for p in ps]
    known = ledger.next_starts(pipeline.name)
    new = [tp for tp in partitions if tp not in known]
    starts: dict[TP, int] = {tp: known[tp] for tp in partitions if tp in known}
    log_start = admin.list_offsets(config, partitions, spec="earliest")
    discovered: dict[str, dict[str, int | str]] = {}
    if not known:  # the pipeline's first checkpoint (of its lineage): the startup policy
        starts.update(startup_offsets(pipeline, new))
    else:
        # A partition found later (the topic grew) starts from its earliest offset whatever
        # the startup policy, as in Flink: its records were all written after the pipeline
        # started, so "latest" (or a group/timestamp start) would silently skip them.
        for topic, partition in new:
            starts[(topic, partition)] = log_start[(topic, partition)]
            discovered[f"{topic}[{partition}]"] = {
                "start": log_start[(topic, partition)],
                "policy": "earliest",
            }
    # The end is the last stable offset (open transactions of a transactional input
    # are excluded), so the range never reaches into undecided records.
    ends = admin.list_offsets(config, partitions, spec="latest")
    skipped: dict[TP, int] = {}
    for tp in partitions:
        topic, partition = tp
        if starts[tp] > ends[tp]:
            raise SourceError(
                f"pipeline {pipeline.name!r}: {topic}[{partition}] ends at offset {ends[tp]} but "
                f"the next checkpoint must start at {starts[tp]}; was the topic deleted and "
                "recreated? Restore the pipeline from a savepoint or reset it to new offsets."
            )
        if starts[tp] < log_start[tp]:
            if pipeline.on_data_loss != "skip":
                raise DataLossError(
                    f"pipeline {pipeline.name!r}: offsets [{starts[tp]}, {log_start[tp]}) of "
                    f"{topic}[{partition}] were deleted by retention before they were read. "
                    "Nothing was planned. Set on_data_loss='skip' to continue from the log "
                    "start (the skip is recorded in the ledger), or restore the data."
                )
            skipped[tp] = starts[tp]
            starts[tp] = log_start[tp]
    capped = cap_ranges(starts, ends, pipeline.max_records_per_checkpoint)
    has_data = any(capped[tp] > starts[tp] for tp in partitions)
    if not has_data and not new and not skipped:
        return None
    ranges = [
        RangeSpec(
            topic=t,
            partition=p,
            start=starts[(t, p)],
            end=capped[(t, p)],
            skipped_from=skipped.get((t, p)),
        )
        for t, p in partitions
    ]
    details: dict[str, object] = {
        "skipped": {f"{t}[{p}]": [s, starts[(t, p)]] for (t, p), s in skipped.items()}
    }
    if discovered:  # recorded with the plan's event: where each new partition started
        details["discovered"] = discovered
    return ledger.plan(pipeline.name, ranges, max_pending=pipeline.max_pending, actor=actor, details=details)
