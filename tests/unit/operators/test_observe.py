"""What the operators report (operators/_observe.py): a lost stream notifies
``stream_stalled`` and still fails the task; a notifier that raises does not change that;
a no-op abort notifies nothing; the plan and commit tasks report through their
coordinator's listeners."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.core import coordinator
from airflow_provider_eo.core.commit import CommitResult
from airflow_provider_eo.core.metrics import CHECKPOINT_RECORDS, COMMIT_SECONDS, DEAD_LETTERS, PipelineMetrics
from airflow_provider_eo.errors import DataLossError
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.metrics import AirflowStatsSink
from airflow_provider_eo.operators.abort import EoAbortOperator
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.plan import EoPlanOperator
from airflow_provider_eo.operators.stream import EoStreamOperator, StreamDriverFailed
from airflow_provider_eo.pipeline import load_pipeline


@pytest.fixture()
def notified_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A pipeline whose notifiers append ``context["eo"]`` to the module's ``SEEN`` (the
    first ``stream_stalled`` notifier raises)."""
    name = f"eo_test_notified_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from airflow_provider_eo.pipeline import Pipeline

            SEEN = []

            def record(context):
                SEEN.append(context["eo"])

            def broken(context):
                raise RuntimeError("pager down")

            PIPELINE = Pipeline(
                name="orders",
                kafka={{"bootstrap.servers": "127.0.0.1:1"}},
                source_topics=["in"],
                sink_topic="out",
                ledger_url="sqlite:///{tmp_path}/ledger.db",
                staging_dir="{tmp_path}/staging",
                notifiers={{
                    "stream_stalled": [broken, record],
                    "checkpoint_aborted": [record],
                    "data_loss": [record],
                    "dead_letters": [record],
                }},
            )
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:PIPELINE"
    sys.modules.pop(name, None)


def _seen(ref: str) -> list[dict[str, Any]]:
    return sys.modules[ref.split(":")[0]].SEEN  # type: ignore[no-any-return]


def test_a_lost_stream_notifies_stream_stalled_and_still_fails(
    notified_ref: str, context: dict[str, Any]
) -> None:
    op = EoStreamOperator(task_id="stream", pipeline=notified_ref, deferrable=True)
    lost = {
        "status": "lost",
        "run_id": "r9",
        "reason": "no heartbeat for 93 s",
        "run": {"host": "w1", "pid": 7, "log_path": "/l.log"},
    }
    with pytest.raises(StreamDriverFailed, match="detached driver was lost"):
        op.execute_complete(context, lost)
    (eo,) = _seen(notified_ref)  # the raising notifier before it changed nothing
    assert eo["event"] == "stream_stalled" and eo["pipeline"] == "orders"
    assert eo["reason"] == "no heartbeat for 93 s"
    assert (eo["stream_run_id"], eo["host"], eo["pid"], eo["log_path"]) == ("r9", "w1", 7, "/l.log")
    assert eo["task_id"] == "eo.x"


def test_a_failed_stream_is_not_a_stall(notified_ref: str, context: dict[str, Any]) -> None:
    op = EoStreamOperator(task_id="stream", pipeline=notified_ref, deferrable=True)
    with pytest.raises(StreamDriverFailed):
        op.execute_complete(context, {"status": "failed", "run_id": "r9", "reason": "boom", "run": {}})
    assert _seen(notified_ref) == []


def test_aborting_an_aborted_checkpoint_notifies_nothing(notified_ref: str, context: dict[str, Any]) -> None:
    pipeline = load_pipeline(notified_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        ledger.abort(pipeline.name, 1, reason="first")
    EoAbortOperator(task_id="abort", pipeline=notified_ref, checkpoint_id=1, reason="again").execute(context)
    assert _seen(notified_ref) == []


def test_the_plan_task_notifies_a_data_loss_refusal_and_fails(
    notified_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan task's coordinator listener turns a refusal into ``data_loss``."""

    def lost(*a: Any, **k: Any) -> Any:
        raise DataLossError("in-0 offsets 0-5 were deleted by retention")

    monkeypatch.setattr(coordinator, "plan_checkpoint", lost)
    op = EoPlanOperator(task_id="plan", pipeline=notified_ref, preflight=False)
    with pytest.raises(DataLossError):
        op.execute(context)
    (eo,) = _seen(notified_ref)
    assert eo["event"] == "data_loss" and eo["error"] == "DataLossError"
    assert "deleted by retention" in eo["reason"]


def test_the_commit_task_reports_a_commit_it_made_and_not_a_repeat(
    notified_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local commit by the task: the metrics through Airflow's Stats and ``dead_letters``
    from the coordinator's listeners; the same task again (already COMMITTED): nothing."""
    pipeline = load_pipeline(notified_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        ledger.mark_prepared(
            pipeline.name, 1, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
        )

    def commit(pipeline: Any, ledger: Ledger, cid: int, **kw: Any) -> CommitResult:
        assert kw["commit_mode"] == "local"
        done = dataclasses.replace(ledger.mark_committed(pipeline.name, cid), dead_letters=3)
        return CommitResult(done, 5, 0, 0.5)

    sent: list[tuple[str, str, Any]] = []
    monkeypatch.setattr(coordinator, "commit_checkpoint", commit)
    monkeypatch.setattr(
        AirflowStatsSink,
        "_send",
        lambda self, method, name, value, pipeline: sent.append((method, name, value)),
    )
    monkeypatch.setattr(PipelineMetrics, "lag_after", lambda self, kafka, cp: None)  # no broker here
    op = EoCommitOperator(task_id="commit", pipeline=notified_ref, checkpoint_id=1, commit_mode="local")
    assert op.execute(context)["state"] == "COMMITTED"
    (eo,) = _seen(notified_ref)
    assert eo["event"] == "dead_letters" and eo["checkpoint_id"] == 1
    assert ("incr", CHECKPOINT_RECORDS, 5) in sent and ("incr", DEAD_LETTERS, 3) in sent
    assert any(name == COMMIT_SECONDS for _m, name, _v in sent)
    sent.clear()
    op.execute(context)  # a retry of a COMMITTED checkpoint reports nothing
    assert sent == [] and len(_seen(notified_ref)) == 1
