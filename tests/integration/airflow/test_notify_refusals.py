"""Notifications from the operators against the real broker (no DAG run, no Spark): the plan
task that finds its planned offsets deleted by retention notifies ``data_loss`` and fails as
before, every time; the abort task that then aborts the checkpoint notifies
``checkpoint_aborted`` once (an abort of the ABORTED checkpoint notifies nothing)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from airflow_provider_eo.errors import DataLossError
from airflow_provider_eo.operators.abort import EoAbortOperator
from airflow_provider_eo.operators.plan import EoPlanOperator
from airflow_provider_eo.pipeline import load_pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


@pytest.fixture()
def pipeline_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> Iterator[str]:
    """A one-partition pipeline on the session broker whose notifiers append
    ``context["eo"]`` to its module's ``SEEN``."""
    name = f"eo_notify_refusals_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from airflow_provider_eo.pipeline import Pipeline

            SEEN = []

            def record(context):
                SEEN.append(context["eo"])

            PIPELINE = Pipeline(
                name="{name}",
                kafka={{"bootstrap.servers": "{kafka_bootstrap}"}},
                source_topics=["{make_topic("nr-src", 1)}"],
                sink_topic="{make_topic("nr-sink", 1)}",
                ledger_url="sqlite:///{tmp_path}/ledger.db",
                staging_dir="{tmp_path}/staging",
                notifiers={{"data_loss": [record], "checkpoint_aborted": [record]}},
            )
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:PIPELINE"
    sys.modules.pop(name, None)


def _context(task_id: str) -> dict[str, Any]:
    return {"ti": SimpleNamespace(dag_id="eo_pipeline", run_id="r1", task_id=task_id, try_number=1)}


def test_lost_offsets_notify_data_loss_and_the_abort_notifies_once(
    pipeline_ref: str, kafka_bootstrap: str
) -> None:
    plan = EoPlanOperator(task_id="eo.plan", pipeline=pipeline_ref, preflight=False)
    pipeline = load_pipeline(pipeline_ref)
    module = sys.modules[pipeline_ref.split(":")[0]]
    topic = pipeline.source_topics[0]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(50):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    planned = plan.execute(_context("eo.plan"))
    assert planned is not None and planned["checkpoint_id"] == 1

    # Retention takes offsets [0, 20) before the checkpoint was prepared.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 0, 20)], request_timeout=30).values():
        assert fut.result(timeout=60).low_watermark == 20

    for _ in range(2):  # every try refuses, and says so
        with pytest.raises(DataLossError, match=rf"{topic}\[0\]: \[0, 20\)"):
            plan.execute(_context("eo.plan"))
    assert [e["event"] for e in module.SEEN] == ["data_loss", "data_loss"]
    loss = module.SEEN[0]
    assert loss["pipeline"] == pipeline.name and loss["checkpoint_id"] == 1
    assert loss["error"] == "DataLossError" and f"{topic}[0]: [0, 20)" in loss["reason"]
    assert (loss["dag_id"], loss["task_id"]) == ("eo_pipeline", "eo.plan")

    # The operator aborts it on purpose (its range is replanned from the log start).
    abort = EoAbortOperator(task_id="eo.abort", pipeline=pipeline_ref, checkpoint_id=1, reason="offsets gone")
    assert abort.execute(_context("eo.abort"))["state"] == "ABORTED"
    abort.execute(_context("eo.abort"))  # already ABORTED: nothing new to tell
    aborted = [e for e in module.SEEN if e["event"] == "checkpoint_aborted"]
    assert len(aborted) == 1, module.SEEN
    assert aborted[0]["checkpoint_id"] == 1 and aborted[0]["reason"] == "offsets gone"
    assert aborted[0]["task_id"] == "eo.abort"
