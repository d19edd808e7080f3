"""Restore from a savepoint, and reset: recorded lineage breaks (docs/design.md §7).

Both start a new lineage of the pipeline at chosen offsets; the range after the new start is
processed again (that is the point), and the ledger's ``restore`` event says who asked,
why, from which savepoint or target, and with which ``request_key`` (a retried Airflow task
with the same key restores once). Both are refused, with nothing changed:

- while a checkpoint is unfinished (commit or abort it first);
- when an offset lies below the partition's log start (retention deleted what it points at)
  or above its log end (the topic was re-created smaller);
- restore only: when the savepoint's partitions and the source topics' current partitions
  differ, unless ``allow_non_restored`` (Flink's allowNonRestoredState): then a partition
  the savepoint lacks starts from its earliest offset (as a newly discovered partition
  does) and one that no longer exists is dropped, both recorded in the event.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.errors import ConfigError, RestoreRefused
from airflow_provider_eo.ledger import Actor, InvariantViolation, Ledger, SavepointRecord
from airflow_provider_eo.ledger.lineage import RestoreOutcome
from airflow_provider_eo.pipeline import Pipeline

TP = tuple[str, int]


@dataclass(frozen=True)
class RestoreResult:
    """What a restore or reset did (``eo restore/reset --json``, XCom).

    :param offsets: where each partition of the new lineage starts.
    :param non_restored: with ``allow_non_restored``: ``{"vanished": [...], "lacking":
        {...}}``, partitions dropped and partitions started from earliest; else empty.
    :param repeated: True when an earlier request with the same ``request_key`` did it.
    """

    pipeline: str
    lineage: int
    offsets: Mapping[str, Mapping[int, int]]
    reason: str
    non_restored: Mapping[str, Any] = field(default_factory=dict)
    repeated: bool = False

    def summary(self) -> dict[str, Any]:
        """JSON-ready description."""
        return {
            "pipeline": self.pipeline,
            "lineage": self.lineage,
            "offsets": {t: {str(p): o for p, o in parts.items()} for t, parts in self.offsets.items()},
            "reason": self.reason,
            "non_restored": dict(self.non_restored),
            "repeated": self.repeated,
        }


# -- pure logic -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetTarget:
    """A parsed ``--to``: ``kind`` is earliest, latest, timestamp (``timestamp_ms``) or
    offsets (``offsets``: ``{"topic": {partition: offset}}``)."""

    kind: str
    timestamp_ms: int | None = None
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def describe(self) -> str:
        """The target as the user wrote it, normalised."""
        if self.kind == "timestamp":
            assert self.timestamp_ms is not None
            when = dt.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=dt.timezone.utc)
            return f"timestamp={when.isoformat()}"
        if self.kind == "offsets":
            return "offsets=" + json.dumps(
                {
                    t: {str(p): o for p, o in sorted(parts.items())}
                    for t, parts in sorted(self.offsets.items())
                }
            )
        return self.kind


_TO_HELP = (
    "use earliest, latest, timestamp=<ISO-8601> (e.g. timestamp=2024-05-01T00:00:00Z) or "
    'offsets=<JSON> (e.g. offsets=\'{"orders": {"0": 42, "1": 7}}\')'
)


def parse_reset_target(to: str) -> ResetTarget:
    """Parse ``--to``; :class:`ConfigError` saying what is accepted for anything else.

    A timestamp without a zone is UTC.
    """
    text = to.strip()
    if text in ("earliest", "latest"):
        return ResetTarget(text)
    kind, sep, value = text.partition("=")
    if sep and kind == "timestamp":
        try:
            when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(f"--to {to!r}: {value!r} is not an ISO-8601 time; {_TO_HELP}") from exc
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        ms = int(when.timestamp() * 1000)
        if ms < 0:
            raise ConfigError(f"--to {to!r}: the time is before 1970; {_TO_HELP}")
        return ResetTarget("timestamp", timestamp_ms=ms)
    if sep and kind == "offsets":
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"--to {to!r}: the offsets are not valid JSON ({exc}); {_TO_HELP}") from exc
        offsets: dict[str, dict[int, int]] = {}
        if not isinstance(data, dict) or not data:
            raise ConfigError(
                f"--to {to!r}: give a non-empty object {{topic: {{partition: offset}}}}; {_TO_HELP}"
            )
        for topic, parts in data.items():
            if not isinstance(parts, dict) or not parts:
                raise ConfigError(
                    f"--to {to!r}: topic {topic!r} needs a non-empty object {{partition: offset}}; {_TO_HELP}"
                )
            for part, off in parts.items():
                try:
                    p, o = int(part), off
                except ValueError as exc:
                    raise ConfigError(
                        f"--to {to!r}: partition {part!r} of {topic!r} is not a number"
                    ) from exc
                if isinstance(o, bool) or not isinstance(o, int) or o < 0 or p < 0:
                    raise ConfigError(
                        f"--to {to!r}: {topic}[{part}] needs a partition >= 0 and a whole "
                        f"offset >= 0, got {off!r}"
                    )
                offsets.setdefault(str(topic), {})[p] = o
        return ResetTarget("offsets", offsets=offsets)
    raise ConfigError(f"--to {to!r} is not understood; {_TO_HELP}")


def partition_diff(saved: Iterable[TP], current: Iterable[TP]) -> tuple[list[TP], list[TP]]:
    """``(vanished, lacking)``: partitions the savepoint has that the source topics no
    longer have, and current partitions the savepoint lacks; each sorted."""
    saved_set, current_set = set(saved), set(current)
    return sorted(saved_set - current_set), sorted(current_set - saved_set)


def out_of_range(
    offsets: Mapping[TP, int], log_start: Mapping[TP, int], log_end: Mapping[TP, int]
) -> list[str]:
    """Each offset below its partition's log start or above its log end, described."""
    problems = []
    for tp in sorted(offsets):
        o, lo, hi = offsets[tp], log_start[tp], log_end[tp]
        name = f"{tp[0]}[{tp[1]}]"
        if o < lo:
            problems.append(
                f"{name}: offset {o} is below the log start {lo} (retention deleted [{o}, {lo}): data loss)"
            )
        elif o > hi:
            problems.append(
                f"{name}: offset {o} is above the log end {hi} (was the topic deleted and re-created?)"
            )
    return problems


def nested(offsets: Mapping[TP, int]) -> dict[str, dict[int, int]]:
    """``{(topic, p): o}`` as ``{"topic": {p: o}}``."""
    out: dict[str, dict[int, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[p] = o
    return out


def _label(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


# -- restore and reset ----------------------------------------------------------------------


def _refuse_unfinished(pipeline: Pipeline, ledger: Ledger, what: str) -> None:
    low = ledger.unfinished(pipeline.name)
    if low is not None:
        raise InvariantViolation(
            f"pipeline {pipeline.name!r}: cannot {what} while checkpoint {low.checkpoint_id} is "
            f"{low.state.value}; nothing was changed. Let it finish (`eo commit MODULE:ATTR "
            f"--checkpoint {low.checkpoint_id}`), or stop the pipeline with a savepoint "
            "(`eo savepoint create MODULE:ATTR NAME --stop`), or abort it (`eo abort MODULE:ATTR "
            f"{low.checkpoint_id} --reason TEXT`), then ask again."
        )


def _refuse_query_batches(pipeline: Pipeline, ledger: Ledger, what: str) -> None:
    """A pipeline whose checkpoints are a Structured Streaming query's batches takes its
    positions from the query's checkpoint location, not from the ledger: a new lineage
    there would only make the query's next batch be refused (its ranges continue the
    query's own offsets)."""
    newest = ledger.last_committed(pipeline.name) or ledger.unfinished(pipeline.name)
    if newest is not None and newest.query_id is not None:
        raise RestoreRefused(
            f"pipeline {pipeline.name!r}: cannot {what}: its checkpoints are the batches of "
            f"Structured Streaming query {newest.query_id}, which restarts from its checkpoint "
            "location; nothing was changed. Start the query from a copy of its checkpoint "
            "location (`eo savepoint create MODULE:ATTR NAME --copy-checkpoint-to DIR`), or "
            "write to another sink name to process records again (docs/design.md §12)."
        )


def _repeated(pipeline: str, outcome: RestoreOutcome) -> RestoreResult:
    info = outcome.details
    offsets: dict[TP, int] = {}
    for label, o in dict(info.get("offsets", {})).items():
        topic, _, rest = str(label).rpartition("[")
        offsets[(topic, int(rest.rstrip("]")))] = int(o)
    return RestoreResult(
        pipeline=pipeline,
        lineage=outcome.lineage,
        offsets=nested(offsets),
        reason=str(info.get("reason", "")),
        non_restored=dict(info.get("non_restored", {})),
        repeated=True,
    )


def _current_partitions(pipeline: Pipeline, clients: KafkaClients) -> list[TP]:
    topics = clients.partitions_of(pipeline.source_topics)
    return [(t, p) for t, ps in sorted(topics.items()) for p in ps]


def _apply(
    pipeline: Pipeline,
    ledger: Ledger,
    offsets: Mapping[TP, int],
    *,
    reason: str,
    lineage: int,
    actor: Actor | None,
    request_key: str | None,
    details: Mapping[str, Any],
    non_restored: Mapping[str, Any],
) -> RestoreResult:
    from airflow_provider_eo.core.savepoint import who

    outcome = ledger.restore_once(
        pipeline.name,
        dict(offsets),
        reason=reason,
        actor=actor,
        expected_lineage=lineage,
        request_key=request_key,
        details={**details, "requested_by": who(actor), "non_restored": dict(non_restored)},
    )
    if outcome.repeated:
        return _repeated(pipeline.name, outcome)
    return RestoreResult(
        pipeline=pipeline.name,
        lineage=outcome.lineage,
        offsets=nested(offsets),
        reason=reason,
        non_restored=dict(non_restored),
    )


def restore_from_savepoint(
    pipeline: Pipeline,
    ledger: Ledger,
    savepoint: str | SavepointRecord,
    *,
    allow_non_restored: bool = False,
    actor: Actor | None = None,
    request_key: str | None = None,
    clients: KafkaClients | None = None,
) -> RestoreResult:
    """Start a new lineage of ``pipeline`` at the savepoint's offsets (see the module
    docstring for what is refused). Idempotent per ``request_key``: a second call with the
    same key changes nothing and returns the first result with ``repeated=True``.
    ``clients``: the source's Kafka side (default: the real cluster; tests pass a fake)."""
    clients = kafka_clients(pipeline.kafka, clients)
    name = savepoint if isinstance(savepoint, str) else savepoint.name
    current = ledger.get_pipeline(pipeline.name)  # an unknown pipeline is refused here
    if request_key:  # a retry of a done request: no-op, before any other check
        earlier = ledger.find_restore(pipeline.name, request_key)
        if earlier is not None:
            return _repeated(pipeline.name, earlier)
    sp = ledger.get_savepoint(pipeline.name, name)
    _refuse_query_batches(pipeline, ledger, f"restore from savepoint {name!r}")
    _refuse_unfinished(pipeline, ledger, f"restore from savepoint {name!r}")
    saved = {(t, p): o for t, parts in sp.offsets.items() for p, o in parts.items()}
    now_parts = _current_partitions(pipeline, clients)
    vanished, lacking = partition_diff(saved, now_parts)
    if (vanished or lacking) and not allow_non_restored:
        lines = [f"{_label(tp)} is in the savepoint but no longer in the source topics" for tp in vanished]
        lines += [f"{_label(tp)} is in the source topics but not in the savepoint" for tp in lacking]
        raise RestoreRefused(
            f"pipeline {pipeline.name!r}: savepoint {name!r} does not match the source topics' "
            f"partitions: {'; '.join(lines)}. Nothing was changed. Pass --allow-non-restored "
            "(allow_non_restored=True) to drop the vanished partitions and start the new ones "
            "from their earliest offset."
        )
    log_start = clients.list_offsets(now_parts, spec="earliest")
    log_end = clients.list_offsets(now_parts, spec="latest")
    offsets = {tp: o for tp, o in saved.items() if tp not in vanished}
    problems = out_of_range(offsets, log_start, log_end)
    if problems:
        raise RestoreRefused(
            f"pipeline {pipeline.name!r}: savepoint {name!r} points where Kafka holds no data: "
            f"{'; '.join(problems)}. Nothing was changed. Restore from another savepoint, or "
            "reset the pipeline (`eo reset MODULE:ATTR --to earliest|latest|...`)."
        )
    non_restored: dict[str, Any] = {}
    if vanished or lacking:
        for tp in lacking:
            offsets[tp] = log_start[tp]
        non_restored = {
            "vanished": [_label(tp) for tp in vanished],
            "lacking": {_label(tp): log_start[tp] for tp in lacking},
        }
    details: dict[str, Any] = {
        "savepoint": sp.name,
        "savepoint_checkpoint_id": sp.checkpoint_id,
        "savepoint_fingerprint": sp.fingerprint,
        "fingerprint_changed": bool(sp.fingerprint) and sp.fingerprint != current.fingerprint,
    }
    return _apply(
        pipeline,
        ledger,
        offsets,
        reason=f"restore from savepoint {sp.name!r}",
        lineage=current.current_lineage,
        actor=actor,
        request_key=request_key,
        details=details,
        non_restored=non_restored,
    )


def reset_pipeline(
    pipeline: Pipeline,
    ledger: Ledger,
    to: str,
    *,
    actor: Actor | None = None,
    request_key: str | None = None,
    clients: KafkaClients | None = None,
) -> RestoreResult:
    """Start a new lineage of ``pipeline`` at ``to``: ``earliest``, ``latest``,
    ``timestamp=<ISO-8601>`` (each partition's first offset at or after it, else its end)
    or ``offsets=<JSON>`` (``{"topic": {"partition": offset}}``; a partition not named keeps
    where its next checkpoint would start, else its earliest offset). Refused while a
    checkpoint is unfinished, for an offset outside the log, or a partition the source
    topics do not have. Idempotent per ``request_key``. ``clients``: as for
    :func:`restore_from_savepoint`."""
    clients = kafka_clients(pipeline.kafka, clients)
    try:  # a bad target is refused before anything is read or written
        target = parse_reset_target(to)
    except ConfigError as exc:
        raise ConfigError(f"pipeline {pipeline.name!r}: nothing was changed: {exc}") from exc
    current = ledger.get_pipeline(pipeline.name)
    if request_key:
        earlier = ledger.find_restore(pipeline.name, request_key)
        if earlier is not None:
            return _repeated(pipeline.name, earlier)
    _refuse_query_batches(pipeline, ledger, f"reset to {target.describe()}")
    _refuse_unfinished(pipeline, ledger, f"reset to {target.describe()}")
    parts = _current_partitions(pipeline, clients)
    log_start = clients.list_offsets(parts, spec="earliest")
    log_end = clients.list_offsets(parts, spec="latest")
    if target.kind == "earliest":
        offsets = dict(log_start)
    elif target.kind == "latest":
        offsets = dict(log_end)
    elif target.kind == "timestamp":
        assert target.timestamp_ms is not None
        offsets = clients.offsets_for_timestamp(parts, target.timestamp_ms)
    else:
        named = {(t, p): o for t, ps in target.offsets.items() for p, o in ps.items()}
        unknown = sorted(set(named) - set(parts))
        if unknown:
            raise RestoreRefused(
                f"pipeline {pipeline.name!r}: --to names {', '.join(_label(tp) for tp in unknown)}, "
                f"not a partition of its source topics {pipeline.source_topics}; nothing was "
                "changed. Name partitions of the source topics."
            )
        heads = ledger.next_starts(pipeline.name)
        offsets = {tp: heads.get(tp, log_start[tp]) for tp in parts}
        offsets.update(named)
        problems = out_of_range(named, log_start, log_end)
        if problems:
            raise RestoreRefused(
                f"pipeline {pipeline.name!r}: cannot reset to {target.describe()}: "
                f"{'; '.join(problems)}. Nothing was changed; pick offsets inside the log."
            )
    return _apply(
        pipeline,
        ledger,
        offsets,
        reason=f"reset to {target.describe()}",
        lineage=current.current_lineage,
        actor=actor,
        request_key=request_key,
        details={"target": target.describe()},
        non_restored={},
    )
