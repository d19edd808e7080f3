"""EoBackfillOperator: interval parsing, the prepare callable's spark-submit arguments
and idempotence (run_backfill and spark-submit faked: the backfill itself is covered by
the core and the Airflow integration tests)."""

from __future__ import annotations

import datetime as dt
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_eo.core import backfill as core_backfill
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.operators import backfill as backfill_module
from airflow_provider_eo.operators.backfill import EoBackfillOperator, to_epoch_ms
from airflow_provider_eo.operators.submit import PrepareNotRecorded

DAY = 86_400_000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-01-02T00:00:00+00:00", 1735776000000),
        ("2025-01-02 00:00:00+00:00", 1735776000000),  # str() of a pendulum DateTime
        ("2025-01-02T00:00:00Z", 1735776000000),
        ("2025-01-02T00:00:00", 1735776000000),  # naive: UTC
        ("2025-01-02T01:00:00+01:00", 1735776000000),
        (dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc), 1735776000000),
        (1735776000000, 1735776000000),
        ("1735776000000", 1735776000000),
    ],
)
def test_to_epoch_ms(value: Any, expected: int) -> None:
    assert to_epoch_ms(value, field="start") == expected


def test_to_epoch_ms_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="start must be an ISO-8601 instant"):
        to_epoch_ms("yesterday", field="start")


def test_defaults_are_the_data_interval() -> None:
    op = EoBackfillOperator(task_id="b", pipeline="no.such:X", sink_topic="t")
    assert op.start == "{{ data_interval_start }}" and op.end == "{{ data_interval_end }}"
    assert {"start", "end", "sink_topic", "transform", "pipeline", "conf", "jars"} <= set(op.template_fields)


def test_runs_the_interval_and_prepares_by_spark_submit(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    submitted: list[dict[str, Any]] = []
    states = {7: CheckpointState.PLANNED, 8: CheckpointState.PREPARED}

    class FakeLedger:
        def get(self, name: str, checkpoint_id: int) -> Any:
            return SimpleNamespace(state=states[checkpoint_id])

    def fake_submit(task: Any, ctx: Any, **kwargs: Any) -> None:
        submitted.append(kwargs)
        states[kwargs["checkpoint_id"]] = CheckpointState.PREPARED

    def fake_run(request: Any, ledger: Any, **kwargs: Any) -> Any:
        seen.update(
            start_ms=request.start_ms,
            end_ms=request.end_ms,
            sink_topic=request.sink_topic,
            transform=request.transform,
            allow_live_sink=request.allow_live_sink,
            **kwargs,
        )
        backfill = SimpleNamespace(
            name="orders~backfill", transform="acme.t:fn", staging_dir="s3a://bucket/orders"
        )
        kwargs["prepare"](backfill, FakeLedger(), 7)
        kwargs["prepare"](backfill, FakeLedger(), 8)  # already PREPARED: nothing submitted
        return SimpleNamespace(
            summary=lambda: {
                "pipeline": request.live.name,
                "backfill_pipeline": backfill.name,
                "checkpoints": [7, 8],
                "records": 12,
            }
        )

    monkeypatch.setattr(core_backfill, "run_backfill", fake_run)
    monkeypatch.setattr(backfill_module, "submit_prepare", fake_submit)
    op = EoBackfillOperator(
        task_id="b",
        pipeline=pipeline_ref,
        start="2025-01-01T00:00:00+00:00",
        end="2025-01-02 00:00:00+00:00",
        sink_topic="out.backfill",
        transform="m:f",
        deferrable=False,
    )
    out = op.execute(context)
    assert seen["start_ms"] == 1735689600000 and seen["end_ms"] - seen["start_ms"] == DAY
    assert seen["sink_topic"] == "out.backfill" and seen["transform"] == "m:f"
    assert seen["allow_live_sink"] is False and seen["actor"].run_id == "r1"
    assert [s["checkpoint_id"] for s in submitted] == [7]
    assert submitted[0]["extra_args"] == [
        "--backfill-sink-topic",
        "out.backfill",
        "--backfill-transform",
        "m:f",
    ]
    assert submitted[0]["pipeline_ref"] == pipeline_ref and submitted[0]["pipeline_name"] == "orders~backfill"
    assert submitted[0]["staging_dir"] == "s3a://bucket/orders"  # for Hadoop's S3A connector
    assert out["records"] == 12 and out["checkpoints"] == [7, 8]
    assert out["backfill_pipeline"] == "orders~backfill" and out["pipeline"] == "orders"
    assert out["start"] == "2025-01-01T00:00:00+00:00"


def test_prepare_not_recorded_is_an_error(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FakeLedger:
        def get(self, name: str, checkpoint_id: int) -> Any:
            return SimpleNamespace(state=CheckpointState.PLANNED)

    def fake_run(request: Any, ledger: Any, **kwargs: Any) -> Any:
        kwargs["prepare"](SimpleNamespace(name="bf", transform=None, staging_dir="/tmp/bf"), FakeLedger(), 1)

    monkeypatch.setattr(core_backfill, "run_backfill", fake_run)
    monkeypatch.setattr(backfill_module, "submit_prepare", lambda *_a, **_k: None)
    op = EoBackfillOperator(
        task_id="b", pipeline=pipeline_ref, start=0, end=DAY, sink_topic="t", deferrable=False
    )
    with pytest.raises(PrepareNotRecorded, match="checkpoint 1 is PLANNED"):
        op.execute(context)


def test_deferrable_follows_airflows_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("True", "False"):
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", flag)
        op = EoBackfillOperator(task_id="b", pipeline="no.such:X", sink_topic="t")
        assert op.deferrable is (flag == "True")
    assert EoBackfillOperator(task_id="b", pipeline="no.such:X", sink_topic="t", deferrable=True).deferrable


class _Backfill:
    """A fake ``run_backfill`` over checkpoints 7 and 8 of one interval: each call commits what
    is PREPARED (calling ``progress``) and prepares what is PLANNED, in id order, as the real
    one resumes an interrupted interval."""

    def __init__(self) -> None:
        self.states = {7: CheckpointState.PLANNED, 8: CheckpointState.PLANNED}
        self.calls = 0
        self.backfill = SimpleNamespace(
            name="orders~backfill",
            transform="acme.t:fn",
            staging_dir="/tmp/bf",
            ledger_url="sqlite:////tmp/bf-ledger.db",
        )

    def get(self, name: str, checkpoint_id: int) -> Any:
        return SimpleNamespace(state=self.states[checkpoint_id])

    def __call__(self, request: Any, ledger: Any, **kwargs: Any) -> Any:
        self.calls += 1
        done = []
        for cid in (7, 8):
            if self.states[cid] is CheckpointState.COMMITTED:
                continue
            if self.states[cid] is CheckpointState.PLANNED:
                kwargs["prepare"](self.backfill, self, cid)  # defers in deferrable mode
            self.states[cid] = CheckpointState.COMMITTED
            cp = SimpleNamespace(checkpoint_id=cid, records=5 + cid)
            done.append(cp)
            kwargs["progress"](cp)
        return SimpleNamespace(
            summary=lambda: {
                "pipeline": request.live.name,
                "backfill_pipeline": self.backfill.name,
                "checkpoints": [cp.checkpoint_id for cp in done],
                "records": sum(cp.records for cp in done),
            },
            backfill_pipeline=self.backfill.name,
            checkpoints=tuple(done),
        )


def test_deferrable_prepares_detached_and_waits_in_the_triggerer(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_eo import detach
    from airflow_provider_eo.triggers.checkpoint import EoCheckpointTrigger

    fake = _Backfill()
    launched: list[dict[str, Any]] = []
    submitted: list[dict[str, Any]] = []

    def fake_launch(hook: Any, application: str, **kwargs: Any) -> int:
        launched.append({"application": application, **kwargs})
        return 4242

    monkeypatch.setattr(core_backfill, "run_backfill", fake)
    monkeypatch.setattr(backfill_module, "spark_target", lambda task: ("local[2]", "client"))
    monkeypatch.setattr(backfill_module, "configure_submit", lambda task, ctx, **kw: submitted.append(kw))
    monkeypatch.setattr(backfill_module, "submit_prepare", lambda *_a, **_k: pytest.fail("blocking submit"))
    monkeypatch.setattr(detach, "launch_detached", fake_launch)
    monkeypatch.setattr(EoBackfillOperator, "_get_hook", lambda self: "hook")
    op = EoBackfillOperator(
        task_id="b",
        pipeline=pipeline_ref,
        start=0,
        end=DAY,
        sink_topic="out.backfill",
        deferrable=True,
        poll_interval=0.5,
        prepare_timeout=120,
        log_dir=str(tmp_path),
    )

    def resume(deferred: Any, status: str = "success") -> Any:
        """What the triggerer hands back: the trigger's event, with its echo."""
        kwargs = deferred.trigger.serialize()[1]
        event = {"status": status, "pipeline": kwargs["pipeline"], "checkpoint_id": kwargs["checkpoint_id"]}
        return op.execute_complete(context, {**event, "state": "PREPARED", "echo": kwargs["echo"]})

    with pytest.raises(TaskDeferred) as first:
        op.execute(context)
    trigger = first.value.trigger
    assert isinstance(trigger, EoCheckpointTrigger) and first.value.method_name == "execute_complete"
    kwargs = trigger.serialize()[1]
    assert (kwargs["pipeline"], kwargs["checkpoint_id"], kwargs["wait_for"]) == (
        "orders~backfill",
        7,
        "prepared",
    )
    assert kwargs["launch_id"] == launched[0]["run_id"] and launched[0]["prepare_checkpoint"] == 7
    assert kwargs["echo"] == {"checkpoints": [], "records": 0}
    assert kwargs["ledger_url"] == fake.backfill.ledger_url and 0 < kwargs["deadline"] - time.time() <= 120
    assert submitted[0]["application_args"][:4] == ["--pipeline", pipeline_ref, "--checkpoint", "7"]
    assert submitted[0]["application_args"][4:] == ["--backfill-sink-topic", "out.backfill"]
    assert submitted[0]["ship"] == ["acme.t:fn"] and launched[0]["pipeline"] == "orders~backfill"
    assert str(launched[0]["log_path"]).startswith(str(tmp_path))

    fake.states[7] = CheckpointState.PREPARED  # the detached driver prepared it
    with pytest.raises(TaskDeferred) as second:
        resume(first.value)
    kwargs = second.value.trigger.serialize()[1]
    # 7 was committed on resume; its id and records travel on to the next wait.
    assert kwargs["checkpoint_id"] == 8 and kwargs["echo"] == {"checkpoints": [7], "records": 12}
    assert kwargs["launch_id"] != launched[0]["run_id"]

    fake.states[8] = CheckpointState.PREPARED
    out = resume(second.value)
    assert out["checkpoints"] == [7, 8] and out["records"] == 12 + 13, out
    assert out["backfill_pipeline"] == "orders~backfill" and fake.calls == 3


def test_a_failed_detached_prepare_fails_the_task_with_its_reason(
    pipeline_ref: str, context: dict[str, Any]
) -> None:
    op = EoBackfillOperator(task_id="b", pipeline=pipeline_ref, start=0, end=DAY, sink_topic="t")
    event = {
        "status": "failed",
        "pipeline": "orders~bf",
        "checkpoint_id": 3,
        "state": "PLANNED",
        "reason": "the prepare job ended without the checkpoint PREPARED: Error code is: 1.",
        "echo": {"checkpoints": [2], "records": 4},
    }
    with pytest.raises(PrepareNotRecorded, match=r"checkpoint 3 is PLANNED: .*Error code is: 1\..*resumes"):
        op.execute_complete(context, event)
    with pytest.raises(PrepareNotRecorded, match="still PLANNED at the deadline"):
        op.execute_complete(
            context,
            {**event, "status": "timeout", "reason": "checkpoint 3 still PLANNED at the deadline"},
        )


def test_cluster_deploy_mode_waits_in_the_slot_whatever_deferrable_says(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _Backfill()
    submitted: list[int] = []

    def fake_submit(task: Any, ctx: Any, **kwargs: Any) -> None:
        submitted.append(kwargs["checkpoint_id"])
        fake.states[kwargs["checkpoint_id"]] = CheckpointState.PREPARED

    monkeypatch.setattr(core_backfill, "run_backfill", fake)
    monkeypatch.setattr(backfill_module, "spark_target", lambda task: ("yarn", "cluster"))
    monkeypatch.setattr(backfill_module, "submit_prepare", fake_submit)
    op = EoBackfillOperator(
        task_id="b", pipeline=pipeline_ref, start=0, end=DAY, sink_topic="t", deferrable=True
    )
    out = op.execute(context)
    assert submitted == [7, 8] and out["checkpoints"] == [7, 8]
