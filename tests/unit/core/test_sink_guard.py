"""Which commit markers show another deployment of the same pipeline name (pure logic of
core/sink_guard.py; the real-broker scenario is tests/integration/core/test_two_deployments.py)."""

from __future__ import annotations

from airflow_provider_eo import names
from airflow_provider_eo.core.sink_guard import other_deployments, other_deployments_error
from airflow_provider_eo.errors import CommitError, PipelineNameInUse

OURS = "a" * 32
THEIRS = "b" * 32
THIRD = "c" * 32


def _mark(identity: str | None, checkpoint: int = 3) -> tuple[int, str]:
    return checkpoint, names.marker_metadata(identity) if identity else ""


def test_another_identity_on_another_topic_is_another_deployment() -> None:
    marks = {
        ("sink-a", 0): _mark(OURS),
        ("sink-b", 0): _mark(THEIRS),
        ("sink-b", 1): _mark(THEIRS),
        ("sink-c", 0): _mark(THIRD, 1),
    }
    assert other_deployments(marks, sink_topic="sink-a", identity=OURS) == {
        THEIRS: ["sink-b"],
        THIRD: ["sink-c"],
    }


def test_our_identity_elsewhere_our_own_sink_and_unnamed_markers_are_not() -> None:
    marks = {
        ("old-sink", 0): _mark(OURS),  # this ledger changed its sink topic
        ("sink-a", 1): _mark(THEIRS),  # on our own sink: check_sink's PipelineIdentityMismatch
        ("legacy", 0): _mark(None),  # written before markers named a ledger
        ("other", 0): (5, "something else"),
    }
    assert other_deployments(marks, sink_topic="sink-a", identity=OURS) == {}


def test_an_unregistered_pipeline_sees_every_named_marker_elsewhere_as_another_deployment() -> None:
    marks = {("sink-b", 0): _mark(THEIRS), ("legacy", 0): _mark(None)}
    assert other_deployments(marks, sink_topic="sink-a", identity=None) == {THEIRS: ["sink-b"]}


def test_the_refusal_names_who_where_and_the_choices() -> None:
    error = other_deployments_error(
        "orders", "eo-marker.orders", "sink-a", OURS, {THEIRS: ["sink-b", "sink-c"]}
    )
    assert isinstance(error, PipelineNameInUse) and isinstance(error, CommitError)
    text = str(error)
    assert "'orders'" in text and OURS in text and THEIRS in text and "'sink-a'" in text
    assert "'sink-b', 'sink-c'" in text
    assert "no data is at risk" in text and "another pipeline name" in text
    for topic in ("sink-b", "sink-c"):
        assert (
            "kafka-consumer-groups.sh --bootstrap-server ... --delete-offsets --group "
            f"eo-marker.orders --topic {topic}"
        ) in text
    assert "offsets.retention.minutes" in text
