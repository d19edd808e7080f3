"""The source and sink topics: present, their partitions as the ledger expects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_provider_eo.core.doctor.report import Finding
from airflow_provider_eo.ledger import CheckpointRecord


def judge_source_topics(
    topics: Sequence[str],
    live: Mapping[str, Sequence[int] | None],
    expected: Mapping[tuple[str, int], int],
    *,
    pipeline: str,
) -> list[Finding]:
    """Source topics exist with at least the partitions the ledger has ranges for.

    ``live``: partition ids per topic (``None``: the topic does not exist); ``expected``:
    the ledger's next start per (topic, partition) (its last checkpoints' ranges). A
    missing topic or a partition the ledger knows that is gone: fail (plan would fail, or
    the topic was re-created). New partitions: ok (they start from earliest).
    """
    out: list[Finding] = []
    for topic in topics:
        parts = live.get(topic)
        check = f"source-topic {topic}"
        if parts is None:
            out.append(
                Finding(
                    check,
                    "fail",
                    f"pipeline {pipeline!r}: source topic {topic!r} does not exist",
                    f"create it (kafka-topics --create --topic {topic} --partitions N) or fix "
                    "Pipeline(source_topics=...)",
                )
            )
            continue
        known = sorted(p for t, p in expected if t == topic)
        gone = [p for p in known if p not in parts]
        if gone:
            out.append(
                Finding(
                    check,
                    "fail",
                    f"pipeline {pipeline!r}: the ledger has ranges for {topic}{gone} but the topic "
                    f"now has {len(parts)} partition(s): was it deleted and re-created smaller?",
                    f"give {topic!r} its {max(known) + 1} partitions back (kafka-topics --alter "
                    "--partitions), or restore/reset the pipeline (`eo reset MODULE:ATTR --to ...`)",
                )
            )
            continue
        new = [p for p in parts if known and p not in known]
        extra = f"; {len(new)} new partition(s) {new} will start from earliest" if new else ""
        ledger_note = f", the ledger knows {len(known)}" if known else " (no checkpoint yet)"
        out.append(Finding(check, "ok", f"{topic!r} has {len(parts)} partition(s){ledger_note}{extra}"))
    return out


def judge_sink_topic(
    sink_topic: str,
    live_partitions: int | None,
    *,
    pipeline: str,
    unfinished: CheckpointRecord | None,
    last_committed: CheckpointRecord | None,
) -> list[Finding]:
    """The sink topic(s) exist with the partitions the ledger expects.

    The unfinished checkpoint's frozen commit plan is binding (fewer live partitions than the
    plan: its output cannot be placed, fail). The last committed checkpoint's plan is only a
    comparison: fewer partitions now means the topic was re-created (warn: the markers went
    with it). ``live_partitions`` is of ``sink_topic``; a plan naming another sink is
    reported by its own name with ``None`` (not looked up) unless it is the same topic.
    """
    out: list[Finding] = []
    check = f"sink-topic {sink_topic}"
    if live_partitions is None:
        out.append(
            Finding(
                check,
                "fail",
                f"pipeline {pipeline!r}: sink topic {sink_topic!r} does not exist",
                f"create it (kafka-topics --create --topic {sink_topic} --partitions N) or fix "
                "Pipeline(sink_topic=...)",
            )
        )
        return out
    plan = unfinished.commit_plan if unfinished is not None else None
    if plan is not None and plan.sink_topic == sink_topic and live_partitions < plan.sink_partitions:
        out.append(
            Finding(
                check,
                "fail",
                f"pipeline {pipeline!r}: checkpoint {unfinished.checkpoint_id if unfinished else '?'} "
                f"({unfinished.state.value if unfinished else '?'}) is frozen to publish on "
                f"{plan.sink_partitions} partitions of {sink_topic!r}, which now has {live_partitions}",
                f"give {sink_topic!r} {plan.sink_partitions} partitions again (kafka-topics --alter "
                "--partitions), or abort the checkpoint (`eo abort MODULE:ATTR "
                f"{unfinished.checkpoint_id if unfinished else 'ID'} --reason ...`) so it is replanned",
            )
        )
        return out
    done = last_committed.commit_plan if last_committed is not None else None
    if done is not None and done.sink_topic == sink_topic and live_partitions < done.sink_partitions:
        out.append(
            Finding(
                check,
                "warn",
                f"{sink_topic!r} has {live_partitions} partition(s) but checkpoint "
                f"{last_committed.checkpoint_id if last_committed else '?'} was committed to "
                f"{done.sink_partitions}: the topic was re-created (its committed output and commit "
                "markers are gone)",
                "check that this is intended; the next checkpoint publishes on the topic as it is",
            )
        )
        return out
    why = (
        f", the unfinished checkpoint's plan needs {plan.sink_partitions}"
        if plan is not None and plan.sink_topic == sink_topic
        else ""
    )
    out.append(Finding(check, "ok", f"{sink_topic!r} has {live_partitions} partition(s){why}"))
    return out
