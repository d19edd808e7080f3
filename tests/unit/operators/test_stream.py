"""EoStreamOperator: arguments, lazy work, the driver's failure reason, the summary."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from airflow_provider_eo.core.stream_contract import StreamAppArgs
from airflow_provider_eo.operators.stream import EoStreamOperator, StreamDriverFailed
from airflow_provider_eo.version_compat import AirflowException, AirflowFailException


def test_no_work_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.spark.session as session

    monkeypatch.setattr(session, "connector_jars_csv", lambda: pytest.fail("jars resolved at parse time"))
    op = EoStreamOperator(task_id="stream", pipeline="no.such:X", commit="airflow", checkpoints="{{ x }}")
    assert op.application == "" and op.jars is None and op._conn_id == "spark_default"
    assert {"pipeline", "interval", "commit", "duration", "checkpoints", "conf"} <= set(op.template_fields)


def _fake_submit(monkeypatch: pytest.MonkeyPatch, lines: list[str], error: str | None) -> list[Any]:
    """spark-submit faked: the "application" appends ``lines`` to its --report-file (as
    apps/stream.py does), then exits with ``error`` (the provider's AirflowException)."""
    import airflow_provider_eo.operators.stream as mod

    calls: list[Any] = []

    def configure(task: Any, context: Any, **kwargs: Any) -> bool:
        calls.append(kwargs)
        return False

    def execute(task: Any, context: Any) -> None:
        args = calls[-1]["application_args"]
        report = args[args.index("--report-file") + 1]
        with open(report, "a") as out:
            out.writelines(line + "\n" for line in lines)
        if error:
            raise AirflowException(error)

    monkeypatch.setattr(mod, "configure_submit", configure)
    monkeypatch.setattr(mod, "spark_target", lambda task: ("local[2]", "client"))
    monkeypatch.setattr(mod.SparkSubmitOperator, "execute", execute)
    return calls


def test_the_application_arguments(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = '{"pipeline": "orders", "commit": "airflow", "checkpoints": 3, "records": 0, "reason": "x"}'
    calls = _fake_submit(monkeypatch, [summary], None)
    EoStreamOperator(
        task_id="stream",
        pipeline=pipeline_ref,
        interval="2",
        commit="airflow",
        checkpoints="3",
        heartbeat=2,
        deferrable=False,  # the driver a child of the task (the tests' default_deferrable is on)
    ).execute(context)
    args = calls[0]["application_args"]
    report = args[args.index("--report-file") + 1]
    assert args == [
        "--pipeline", pipeline_ref, "--interval", "2.0", "--commit", "airflow", "--checkpoints", "3",
        "--report-file", report, "--heartbeat", "2.0",
    ]  # fmt: skip
    assert StreamAppArgs.from_argv(args) == StreamAppArgs(
        pipeline_ref, interval=2.0, commit="airflow", checkpoints=3, report_file=report, heartbeat=2.0
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"commit": "later"}, "commit must be one of ('inline', 'airflow'), got 'later'"),
        ({"interval": 0}, "interval must be > 0 seconds, got 0.0"),
        ({"duration": 1.0, "checkpoints": 1}, "give duration or checkpoints, not both"),
        ({"checkpoints": "0"}, "checkpoints must be >= 1, got 0"),
    ],
)
def test_a_bad_setting_fails_the_task_without_retry(
    pipeline_ref: str, context: dict[str, Any], fields: dict[str, Any], message: str
) -> None:
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, **fields)
    with pytest.raises(AirflowFailException) as info:
        op.execute(context)
    assert str(info.value) == f"pipeline 'orders': {message}"


def test_a_bad_heartbeat_is_refused_at_parse_time() -> None:
    with pytest.raises(ValueError, match=r"^stream: heartbeat must be > 0 seconds, got 0$"):
        EoStreamOperator(task_id="stream", pipeline="no.such:X", heartbeat=0)


def test_success_returns_the_summary(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = (
        '{"pipeline": "orders", "commit": "inline", "checkpoints": 2, "records": 7, "reason": "checkpoints"}'
    )
    calls = _fake_submit(
        monkeypatch, ['{"checkpoint": 1, "records": 7}', summary, *["spark noise"] * 30], None
    )
    op = EoStreamOperator(
        task_id="stream", pipeline=pipeline_ref, interval="2", checkpoints="2", deferrable=False
    )
    result = op.execute(context)
    assert result["checkpoints"] == 2 and result["records"] == 7 and result["unfinished"] == []
    assert calls[0]["application"].endswith("airflow_provider_eo/apps/stream.py")
    args = calls[0]["application_args"]
    assert args[args.index("--checkpoints") + 1] == "2"
    report = args[args.index("--report-file") + 1]
    assert not os.path.exists(report), "the report file is removed after reading"


def test_driver_death_fails_with_its_reason(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_eo.ledger import Ledger, RangeSpec
    from airflow_provider_eo.pipeline import load_pipeline

    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
    failure = {
        "error": "RuntimeError: injected fault at prepare.after_write",
        "traceback": ["Traceback (most recent call last):", '  File "stream.py", line 1, in run'],
    }
    _fake_submit(
        monkeypatch,
        ['{"checkpoint": 1, "records": 7}', json.dumps(failure), "{cut by a kill"],
        "Cannot execute: spark-submit ... Error code is: 3.",
    )
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, checkpoints=1, deferrable=False)
    with pytest.raises(StreamDriverFailed, match="exit code 3") as info:
        op.execute(context)
    assert info.value.exit_code == 3 and info.value.unfinished == [1]
    assert "injected fault at prepare.after_write" in str(info.value)
    assert info.value.tail[0] == "Traceback (most recent call last):"


def test_killed_driver_says_so(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_submit(
        monkeypatch, ['{"checkpoint": 1, "records": 7}'], "Cannot execute: spark-submit. Error code is: -9."
    )
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, checkpoints=1, deferrable=False)
    with pytest.raises(StreamDriverFailed, match="exited without reporting an error") as info:
        op.execute(context)
    assert info.value.exit_code == -9


def test_execute_complete_returns_the_summary_or_fails_with_the_drivers_error(pipeline_ref: str) -> None:
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, deferrable=True)
    ok = {
        "status": "success",
        "run_id": "r1",
        "run": {
            "summary": {"checkpoints": 2, "records": 9, "reason": "checkpoints"},
            "reason": "checkpoints",
        },
    }
    result = op.execute_complete({}, ok)
    assert result["checkpoints"] == 2 and result["records"] == 9 and result["unfinished"] == []
    failed = {
        "status": "failed",
        "run_id": "r2",
        "reason": "the driver exited without ending its run",
        "run": {"host": "w1", "pid": 7, "error": "Traceback ...\nKafkaException: boom", "log_path": "/l.log"},
    }
    with pytest.raises(StreamDriverFailed, match=r"detached driver failed \(run r2 on w1, pid 7\)") as err:
        op.execute_complete({}, failed)
    assert "KafkaException: boom" in str(err.value) and "/l.log" in str(err.value)
    assert err.value.tail[-1] == "KafkaException: boom"
    with pytest.raises(StreamDriverFailed, match="detached driver was lost"):
        op.execute_complete({}, {**failed, "status": "lost"})


def test_deferrable_refuses_cluster_mode(pipeline_ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_provider_eo.operators.stream as stream_mod

    monkeypatch.setattr(stream_mod, "spark_target", lambda task: ("yarn", "cluster"))
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, deferrable=True)
    with pytest.raises(AirflowFailException, match="durable submission"):
        op._execute_detached({}, op.resolve_pipeline(), StreamAppArgs(pipeline_ref))


def test_a_stopping_run_is_waited_for_not_reattached(pipeline_ref: str) -> None:
    """A cleared task's new try must start a new stream, not end with the old (stopping) one."""
    import threading

    from airflow_provider_eo.ledger import Ledger

    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, deferrable=True, poll_interval=0.05)
    pipeline = op.resolve_pipeline()
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.register_stream_run(
            pipeline.name, run_id="old", host="h", pid=1, commit_mode="inline", heartbeat_s=30
        )
        ledger.request_stream_stop(pipeline.name, requested_by="airflow: the waiting task was stopped")
        live = ledger.live_stream_run(pipeline.name)
    assert live is not None and live.stop_requested_at is not None

    def end_soon() -> None:
        with Ledger(pipeline.ledger_url) as ledger:
            ledger.end_stream_run("old", state="ENDED", reason="stop requested", summary={})

    timer = threading.Timer(0.5, end_soon)
    timer.start()
    assert op._wait_for_end(pipeline, live) is None  # it ended: the caller starts a new run
    timer.join()


def test_deferrable_follows_airflows_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("True", "False"):
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", flag)
        assert EoStreamOperator(task_id="s", pipeline="no.such:X").deferrable is (flag == "True")
        assert EoStreamOperator(task_id="s", pipeline="no.such:X", deferrable=False).deferrable is False
        assert EoStreamOperator(task_id="s", pipeline="no.such:X", deferrable=True).deferrable is True


def test_default_deferral_in_cluster_mode_runs_in_the_slot(
    pipeline_ref: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deferral by Airflow's default where it cannot apply (cluster deploy mode): the Spark
    provider tracks the driver from the task, as with deferrable=False; never refused."""
    import airflow_provider_eo.operators.stream as stream_mod

    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    calls: list[Any] = []
    monkeypatch.setattr(stream_mod, "spark_target", lambda task: ("yarn", "cluster"))
    monkeypatch.setattr(stream_mod, "configure_submit", lambda task, ctx, **kw: calls.append(kw) or True)
    monkeypatch.setattr(stream_mod.SparkSubmitOperator, "execute", lambda task, ctx: None)
    monkeypatch.setattr(
        EoStreamOperator, "_execute_detached", lambda *a, **k: pytest.fail("deferred in cluster mode")
    )
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, checkpoints=1)
    assert op.deferrable is True
    try:
        op.execute(context)
    except Exception as exc:  # what cluster mode does after the driver ends is not this test's
        assert "deferred in cluster mode" not in str(exc), exc
    assert calls, "the driver was not submitted from the task"
