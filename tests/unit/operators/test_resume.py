"""Durable spark-submit per unit of work (operators/_resume.py) through the Spark provider's
own resumable path: ``SparkSubmitOperator.execute`` -> ``ResumableJobMixin.execute_resumable``
with a ``spark://`` master in cluster deploy mode, the real status vocabulary of the
provider's standalone backend, and only the cluster faked (submission, status, the driver's
run: :class:`FakeCluster`) with the task's state store as a dict (:class:`MemoryStore`).
Real standalone drivers and Airflow's own store: tests/integration/airflow/test_resumable_submit.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_eo.core import backfill as core_backfill
from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec
from airflow_provider_eo.operators._resume import resume_key, resume_submission, scope_resume_keys
from airflow_provider_eo.operators.backfill import EoBackfillOperator
from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.stream import EoStreamOperator
from airflow_provider_eo.operators.submit import EoSubmitOperator
from airflow_provider_eo.pipeline import load_pipeline

# Named so configure_submit adds no jar (add_task_time_jars: the user gave the connector).
CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"


class MemoryStore:
    """What the mixin and eo use of ``context["task_state_store"]``, over a dict."""

    def __init__(self, **data: Any) -> None:
        self.data: dict[str, Any] = dict(data)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


@dataclass
class FakeCluster:
    """Drivers by id with the standalone master's states. A submitted driver is RUNNING;
    polling it runs ``work`` with its application arguments, then it is FINISHED. A driver
    the cluster does not know answers as the standalone REST API does (``success: false``)."""

    work: Callable[[list[str]], None]
    drivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    polled: list[str] = field(default_factory=list)
    submissions: list[list[str]] = field(default_factory=list)

    def add(self, driver_id: str, state: str, args: list[str] | None = None) -> None:
        self.drivers[driver_id] = {"state": state, "args": args or []}

    def submit(self, op: SparkSubmitOperator) -> str:
        driver_id = f"driver-{len(self.submissions) + 1}"
        self.submissions.append([str(a) for a in op.application_args or []])
        self.add(driver_id, "RUNNING", self.submissions[-1])
        return driver_id

    def status(self, driver_id: Any) -> str:
        if driver_id not in self.drivers:
            raise RuntimeError(f"Spark REST API returned failure for {driver_id}: unknown error")
        return str(self.drivers[driver_id]["state"])

    def run(self, driver_id: Any) -> None:
        self.polled.append(driver_id)
        driver = self.drivers[driver_id]
        if driver["state"] == "RUNNING":
            self.work(driver["args"])
            driver["state"] = "FINISHED"
        if driver["state"] != "FINISHED":
            raise RuntimeError(f"Driver {driver_id} exited with status {driver['state']}")

    def submitted(self) -> list[list[str]]:
        """The arguments of every driver submitted through the operator."""
        return self.submissions

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The cluster behind every SparkSubmitOperator's durable path."""
        cls = SparkSubmitOperator
        monkeypatch.setattr(cls, "submit_job", lambda op, ctx: self.submit(op))
        monkeypatch.setattr(cls, "get_job_status", lambda op, eid, ctx: self.status(eid))
        monkeypatch.setattr(cls, "poll_until_complete", lambda op, eid, ctx: self.run(eid))


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.fixture()
def cluster_conn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spark_default``: a standalone master, cluster deploy mode (the provider tracks the
    driver through its durable path)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://127.0.0.1",
                "port": 7077,
                "extra": {"deploy-mode": "cluster"},
            }
        ),
    )


@pytest.fixture()
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture()
def ctx(context: dict[str, Any], store: MemoryStore) -> dict[str, Any]:
    context["ti"].stats_tags = {}
    return {**context, "task_state_store": store}


@pytest.fixture()
def planned(pipeline_ref: str) -> Iterator[tuple[Any, Ledger]]:
    """The unit pipeline with checkpoint 1 planned."""
    pipeline = load_pipeline(pipeline_ref)
    with Ledger(pipeline.ledger_url) as ledger:
        ledger.ensure_pipeline(pipeline.name, pipeline.fingerprint())
        ledger.plan(pipeline.name, [RangeSpec("in", 0, 0, 5)])
        yield pipeline, ledger


def _mark_prepared(ledger: Ledger, name: str, checkpoint_id: int) -> None:
    ledger.mark_prepared(
        name, checkpoint_id, attempt="a", staging_location="/x", records=5, bytes_=5, shard_counts={0: 5}
    )


def _commit_first_plan_second(ledger: Ledger, name: str) -> None:
    """Checkpoint 1 COMMITTED, checkpoint 2 PLANNED."""
    _mark_prepared(ledger, name, 1)
    ledger.mark_committed(name, 1)
    ledger.plan(name, [RangeSpec("in", 0, 5, 9)])


def _prepare_work(ledger: Ledger, name: str) -> Callable[[list[str]], None]:
    """What a prepare driver does: its checkpoint becomes PREPARED."""
    return lambda args: _mark_prepared(ledger, name, int(_arg(args, "--checkpoint")))


def _submit_op(pipeline_ref: str, checkpoint_id: int) -> EoSubmitOperator:
    return EoSubmitOperator(
        task_id="prepare", pipeline=pipeline_ref, checkpoint_id=checkpoint_id, packages=CONNECTOR
    )


def test_resume_keys_name_the_application_the_pipeline_and_the_checkpoint() -> None:
    assert resume_key("prepare", "orders", 7) == "eo:prepare:orders:7"
    assert resume_key("commit", "orders", 7) == "eo:commit:orders:7"
    assert resume_key("stream", "orders") == "eo:stream:orders"
    assert len({resume_key("prepare", "orders", 1), resume_key("prepare", "orders", 11)}) == 2


def test_a_backfill_try_submits_one_driver_per_checkpoint(
    pipeline_ref: str,
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    states = dict.fromkeys((1, 2, 3), CheckpointState.PLANNED)

    class BackfillLedger:
        def get(self, name: str, checkpoint_id: int) -> Any:
            return SimpleNamespace(state=states[checkpoint_id])

    cluster = FakeCluster(
        lambda args: states.__setitem__(int(_arg(args, "--checkpoint")), CheckpointState.PREPARED)
    )
    cluster.install(monkeypatch)

    def run_backfill(request: Any, ledger: Any, **kwargs: Any) -> Any:
        backfill = SimpleNamespace(name="orders~backfill", transform=None, staging_dir="/tmp/bf")
        for checkpoint_id in (1, 2, 3):  # one try prepares them in turn
            kwargs["prepare"](backfill, BackfillLedger(), checkpoint_id)
        return SimpleNamespace(summary=lambda: {"checkpoints": [1, 2, 3], "records": 3})

    monkeypatch.setattr(core_backfill, "run_backfill", run_backfill)
    op = EoBackfillOperator(
        task_id="b", pipeline=pipeline_ref, start=0, end=1, sink_topic="t", packages=CONNECTOR
    )
    op.execute(ctx)

    assert [int(_arg(a, "--checkpoint")) for a in cluster.submitted()] == [1, 2, 3]
    assert set(states.values()) == {CheckpointState.PREPARED}
    assert store.data == {
        "eo:prepare:orders~backfill:1": "driver-1",
        "eo:prepare:orders~backfill:2": "driver-2",
        "eo:prepare:orders~backfill:3": "driver-3",
    }


def test_a_retry_reattaches_to_its_checkpoints_running_driver(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, ledger = planned
    _commit_first_plan_second(ledger, pipeline.name)
    cluster = FakeCluster(_prepare_work(ledger, pipeline.name))
    cluster.install(monkeypatch)
    cluster.add("driver-a", "FINISHED", ["--checkpoint", "1"])
    cluster.add("driver-b", "RUNNING", ["--checkpoint", "2"])
    store.data.update({"eo:prepare:orders:1": "driver-a", "eo:prepare:orders:2": "driver-b"})

    out = _submit_op(pipeline_ref, 2).execute(ctx)

    assert out["state"] == "PREPARED" and out["submitted"] is True
    assert cluster.submitted() == [] and cluster.polled == ["driver-b"]  # no second driver
    assert store.data["eo:prepare:orders:2"] == "driver-b"


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param({"spark_job_id": "driver-a"}, id="the provider's one key (before per-checkpoint keys)"),
        pytest.param({"eo:prepare:orders:1": "driver-a"}, id="the previous checkpoint's key"),
    ],
)
def test_another_checkpoints_finished_driver_never_stands_for_this_one(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
    stored: dict[str, str],
) -> None:
    pipeline, ledger = planned
    _commit_first_plan_second(ledger, pipeline.name)
    cluster = FakeCluster(_prepare_work(ledger, pipeline.name))
    cluster.install(monkeypatch)
    cluster.add("driver-a", "FINISHED", ["--checkpoint", "1"])
    store.data.update(stored)

    out = _submit_op(pipeline_ref, 2).execute(ctx)

    assert out["state"] == "PREPARED"
    assert [_arg(a, "--checkpoint") for a in cluster.submitted()] == ["2"]
    assert store.data["eo:prepare:orders:2"] == "driver-1"


@pytest.mark.parametrize("state", ["FINISHED", "FAILED", "KILLED", "gone"])
def test_an_ended_driver_is_forgotten_and_the_ledger_decides(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
) -> None:
    """The stored driver of this very checkpoint ended (or the master forgot it) but the
    ledger does not show the checkpoint PREPARED: a new driver prepares it (the provider alone
    would take FINISHED for success and submit nothing, and fail on an unknown driver)."""
    pipeline, ledger = planned
    cluster = FakeCluster(_prepare_work(ledger, pipeline.name))
    cluster.install(monkeypatch)
    if state != "gone":
        cluster.add("driver-old", state, ["--checkpoint", "1"])
    store.data["eo:prepare:orders:1"] = "driver-old"

    out = _submit_op(pipeline_ref, 1).execute(ctx)

    assert out["state"] == "PREPARED"
    assert [_arg(a, "--checkpoint") for a in cluster.submitted()] == ["1"]
    assert store.data["eo:prepare:orders:1"] != "driver-old"


def test_a_prepared_checkpoint_reads_nothing_and_submits_nothing(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, ledger = planned
    _mark_prepared(ledger, pipeline.name, 1)
    cluster = FakeCluster(lambda args: pytest.fail("a driver ran"))
    cluster.install(monkeypatch)
    store.data["eo:prepare:orders:1"] = "driver-running-elsewhere"

    out = _submit_op(pipeline_ref, 1).execute(ctx)

    assert out == {**out, "state": "PREPARED", "submitted": False}
    assert cluster.drivers == {} and store.data == {"eo:prepare:orders:1": "driver-running-elsewhere"}


@pytest.mark.parametrize("setup", ["no task_state_store (Airflow < 3.3)", "durable=False"])
def test_without_a_store_or_durability_every_try_submits(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
) -> None:
    pipeline, ledger = planned
    cluster = FakeCluster(_prepare_work(ledger, pipeline.name))
    cluster.install(monkeypatch)
    cluster.add("driver-a", "RUNNING", ["--checkpoint", "1"])
    store.data["eo:prepare:orders:1"] = "driver-a"
    op = _submit_op(pipeline_ref, 1)
    if setup == "durable=False":
        op.durable = False
    else:
        del ctx["task_state_store"]

    assert op.execute(ctx)["state"] == "PREPARED"

    assert [_arg(a, "--checkpoint") for a in cluster.submitted()] == ["1"]
    assert cluster.polled == ["driver-1"]


def test_a_commit_retry_reattaches_to_its_own_commit_driver_only(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, ledger = planned
    _mark_prepared(ledger, pipeline.name, 1)
    cluster = FakeCluster(lambda args: ledger.mark_committed(pipeline.name, int(_arg(args, "--checkpoint"))))
    cluster.install(monkeypatch)
    cluster.add("driver-p", "FINISHED", ["--checkpoint", "1"])  # its prepare: another application
    cluster.add("driver-c", "RUNNING", ["--checkpoint", "1"])
    store.data.update({"eo:prepare:orders:1": "driver-p", "eo:commit:orders:1": "driver-c"})
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=1, commit_mode="spark")

    out = op.execute(ctx)

    assert out["state"] == "COMMITTED" and out["commit_mode"] == "spark"
    assert cluster.submitted() == [] and cluster.polled == ["driver-c"]


def test_a_commit_whose_driver_finished_without_committing_is_submitted_again(
    pipeline_ref: str,
    planned: tuple[Any, Ledger],
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline, ledger = planned
    _mark_prepared(ledger, pipeline.name, 1)
    cluster = FakeCluster(lambda args: ledger.mark_committed(pipeline.name, int(_arg(args, "--checkpoint"))))
    cluster.install(monkeypatch)
    cluster.add("driver-c", "FINISHED", ["--checkpoint", "1"])
    store.data["eo:commit:orders:1"] = "driver-c"
    op = EoCommitOperator(task_id="commit", pipeline=pipeline_ref, checkpoint_id=1, commit_mode="spark")

    assert op.execute(ctx)["state"] == "COMMITTED"
    assert [_arg(a, "--checkpoint") for a in cluster.submitted()] == ["1"]


@pytest.mark.parametrize(("state", "submits"), [("RUNNING", 0), ("FINISHED", 1), ("FAILED", 1)])
def test_a_stream_retry_reattaches_to_a_running_stream_and_restarts_an_ended_one(
    pipeline_ref: str,
    ctx: dict[str, Any],
    store: MemoryStore,
    cluster_conn: None,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
    submits: int,
) -> None:
    cluster = FakeCluster(lambda args: None)
    cluster.install(monkeypatch)
    cluster.add("driver-s", state, ["--pipeline", pipeline_ref])
    store.data["eo:stream:orders"] = "driver-s"
    op = EoStreamOperator(task_id="stream", pipeline=pipeline_ref, packages=CONNECTOR)

    op.execute(ctx)

    assert len(cluster.submitted()) == submits
    assert cluster.polled == (["driver-s"] if submits == 0 else ["driver-1"])


def test_a_status_that_cannot_be_read_lets_the_ledger_decide(
    ctx: dict[str, Any], store: MemoryStore, cluster_conn: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = EoSubmitOperator(task_id="prepare", pipeline="no.such:X", checkpoint_id=1)

    def unreachable(self: Any, external_id: Any, context: Any) -> str:
        raise ConnectionError("master unreachable")

    monkeypatch.setattr(SparkSubmitOperator, "get_job_status", unreachable)
    store.data["eo:prepare:orders:1"] = "driver-x"
    key = resume_key("prepare", "orders", 1)
    assert resume_submission(op, ctx, key=key, what="checkpoint 1") == "forget"
    assert store.data == {} and op.external_id_key == key


def test_the_kubernetes_status_cache_is_scoped_with_the_driver_id() -> None:
    """The provider caches a succeeded Kubernetes driver's phase under one task-wide key and
    answers it for any later driver of the task; scoped, a checkpoint sees only its own."""
    from airflow.providers.apache.spark.operators.spark_submit import _KubernetesSparkSubmitBackend

    op = EoSubmitOperator(task_id="prepare", pipeline="no.such:X", checkpoint_id=1)
    backend = _KubernetesSparkSubmitBackend(op, hook=SimpleNamespace())  # type: ignore[arg-type]
    earlier = {"task_state_store": MemoryStore(k8s_driver_status="Succeeded")}
    assert backend.get_job_status("ns:pod-2", earlier) == "Succeeded"  # type: ignore[arg-type]

    scope_resume_keys(op, resume_key("prepare", "orders", 2))
    assert op.external_id_key == "eo:prepare:orders:2"
    with pytest.raises(RuntimeError, match="cncf-kubernetes"):  # asks Kubernetes, not the cache
        backend.get_job_status("ns:pod-2", earlier)  # type: ignore[arg-type]
    own = {"task_state_store": MemoryStore(**{"eo:prepare:orders:2:k8s_driver_status": "Succeeded"})}
    assert backend.get_job_status("ns:pod-2", own) == "Succeeded"  # type: ignore[arg-type]
