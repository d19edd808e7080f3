"""Who the pipeline is on the cluster: its transactional-id prefix, its marker group, other
deployments of its name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_provider_eo.core.doctor.report import Finding


def transactional_namespace(prefix: str, pipeline: str) -> str:
    """The ``{prefix}.{pipeline}.`` every commit shard's transactional id starts with."""
    return f"{prefix}.{pipeline}."


def judge_prefix(
    pipeline: str,
    configured: str,
    pinned: str | None,
    others: Iterable[tuple[str, str | None]],
) -> Finding:
    """The configured transactional-id prefix against the one pinned in the ledger, and
    the namespace ``{prefix}.{pipeline}.`` against every other pipeline's in the ledger.

    A different pinned prefix: the plan/commit would be refused (fail). Another pipeline
    whose namespace is the same (``eo`` + ``a.b`` and ``eo.a`` + ``b`` both give
    ``eo.a.b.<shard>``): both would fence each other's producers (fail). Pipelines sharing
    just the prefix are fine (their ids differ by pipeline name).
    """
    check = "transactional-id-prefix"
    ours = transactional_namespace(pinned or configured, pipeline)
    clash = sorted(
        name
        for name, prefix in others
        if prefix is not None and name != pipeline and transactional_namespace(prefix, name) == ours
    )
    if pinned is not None and pinned != configured:
        return Finding(
            check,
            "fail",
            f"pipeline {pipeline!r} is configured with transactional_id_prefix={configured!r} but "
            f"the ledger pinned {pinned!r} at its first plan; plan and commit refuse it",
            f"set Pipeline(transactional_id_prefix={pinned!r}) (Kafka fences committers only "
            "within one transactional id), or use a new pipeline name",
        )
    if clash:
        return Finding(
            check,
            "fail",
            f"transactional ids {ours}<shard> of pipeline {pipeline!r} are also those of "
            f"pipeline(s) {clash} in the ledger: their committers would fence each other",
            "choose another transactional_id_prefix (before the first plan) or another pipeline name",
        )
    state = f"pinned {pinned!r}" if pinned is not None else f"{configured!r}, pinned at the first plan"
    return Finding(check, "ok", f"prefix {state}; ids {ours}<shard> are used by no other pipeline")


def judge_marker_group(group: str, members: Sequence[str], identity_error: str | None) -> list[Finding]:
    """The marker group has no members (it is never joined: anything in it is foreign) and
    its markers carry this pipeline's identity (``identity_error``: the refusal message of
    :func:`airflow_provider_eo.core.markers.check_marker_identity`, else ``None``)."""
    out: list[Finding] = []
    if members:
        out.append(
            Finding(
                "marker-group members",
                "fail",
                f"the commit-marker group {group!r} has active member(s) {list(members)}: something "
                "consumes with the provider's own group id",
                f"stop that consumer or give it another group.id; {group!r} must never be used by a consumer",
            )
        )
    else:
        out.append(Finding("marker-group members", "ok", f"{group!r} has no members"))
    if identity_error is not None:
        out.append(
            Finding(
                "marker-group identity",
                "fail",
                identity_error,
                "point the pipeline at its original ledger, or start over under a new pipeline name",
            )
        )
    else:
        out.append(
            Finding(
                "marker-group identity",
                "ok",
                "the commit markers carry this ledger's pipeline identity (or there are none yet)",
            )
        )
    return out


def judge_same_name(pipeline: str, refusal: str | None) -> Finding:
    """No other deployment of this pipeline name (another ledger) publishes to another sink
    (``refusal``: the message of
    :func:`airflow_provider_eo.core.sink_guard.check_other_deployments`, else ``None``)."""
    if refusal is not None:
        return Finding(
            "same-name deployments",
            "fail",
            refusal,
            "give one of the two deployments another pipeline name; if the other one is "
            "retired for good, delete its markers (the command is above)",
        )
    return Finding(
        "same-name deployments",
        "ok",
        f"no other ledger's commit markers for {pipeline!r} on any other topic",
    )
