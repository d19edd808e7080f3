"""eo_pipeline_group: four tasks, in order, templated on the plan's XCom, nothing loaded."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_eo.operators.commit import EoCommitOperator
from airflow_provider_eo.operators.plan import EoPlanOperator
from airflow_provider_eo.operators.submit import EoSubmitOperator
from airflow_provider_eo.sensors.checkpoint import EoCheckpointSensor
from airflow_provider_eo.task_group import eo_pipeline_group


def test_group_shape() -> None:
    with DAG("g", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
        group = eo_pipeline_group(
            "not.imported.at.parse:PIPE",
            group_id="orders",
            spark_conn_id="spark_x",
            deferrable=False,
            retries=4,
            wait_kwargs={"mode": "reschedule"},
        )
    assert group.group_id == "orders"
    ids = ["orders.plan", "orders.prepare", "orders.wait", "orders.commit"]
    assert sorted(dag.task_ids) == sorted(ids)
    for up, down in itertools.pairwise(ids):
        assert dag.get_task(up).downstream_task_ids == {down}
    plan, prepare, wait, commit = (dag.get_task(i) for i in ids)
    assert isinstance(plan, EoPlanOperator) and isinstance(prepare, EoSubmitOperator)
    assert isinstance(wait, EoCheckpointSensor) and isinstance(commit, EoCommitOperator)
    template = "{{ ti.xcom_pull(task_ids='orders.plan')['checkpoint_id'] }}"
    assert prepare.checkpoint_id == wait.checkpoint_id == commit.checkpoint_id == template
    assert prepare._conn_id == "spark_x"
    assert wait.deferrable is False and wait.mode == "reschedule"
    assert all(t.retries == 4 for t in (plan, prepare, wait, commit))


def test_retries_and_deferrable_come_from_the_dag_and_airflow_unless_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No forced retries over the DAG's default_args; the sensor's deferrable default is
    Airflow's [operators] default_deferrable."""
    default_args = {"retries": 7, "retry_delay": timedelta(seconds=11)}
    for flag in ("True", "False"):
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", flag)
        with DAG(
            f"d{flag}", schedule=None, start_date=datetime(2025, 1, 1), default_args=default_args
        ) as dag:
            eo_pipeline_group("m:P", group_id="a")
            eo_pipeline_group(
                "m:P", group_id="b", retries=1, retry_delay=timedelta(seconds=2), deferrable=True
            )
        a = [dag.get_task(f"a.{t}") for t in ("plan", "prepare", "wait", "commit")]
        b = [dag.get_task(f"b.{t}") for t in ("plan", "prepare", "wait", "commit")]
        assert all(t.retries == 7 and t.retry_delay == timedelta(seconds=11) for t in a)
        assert all(t.retries == 1 and t.retry_delay == timedelta(seconds=2) for t in b)
        assert dag.get_task("a.wait").deferrable is (flag == "True")
        assert dag.get_task("b.wait").deferrable is True


def test_example_dag_parses_without_services(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "dags" / "eo_pipeline.py"
    # Its sink asset is built from the pipeline module next to it, as the dag-processor
    # (which puts the DAGs folder on sys.path) builds it.
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("eo_pipeline_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert sorted(dag.task_ids) == ["eo.commit", "eo.plan", "eo.prepare", "eo.wait"]


def test_plan_restores_from_the_run_conf_by_default() -> None:
    with DAG("g2", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
        eo_pipeline_group("m:P", group_id="a")
        eo_pipeline_group("m:P", group_id="b", restore_from=None)
    assert dag.get_task("a.plan").restore_from == "{{ params.get('restore_from') or '' }}"
    assert dag.get_task("b.plan").restore_from is None


def test_commit_mode_and_spark_settings_reach_the_commit_task() -> None:
    with DAG("g3", schedule=None, start_date=datetime(2025, 1, 1)) as dag:
        eo_pipeline_group(
            "m:P",
            group_id="s",
            spark_conn_id="spark_x",
            spark_conf={"spark.a": "1"},
            commit_mode="spark",
            commit_kwargs={"conf": {"spark.b": "2"}},
        )
        eo_pipeline_group("m:P", group_id="d")
    commit = dag.get_task("s.commit")
    assert isinstance(commit, EoCommitOperator)
    assert commit.commit_mode == "spark" and commit._conn_id == "spark_x"
    assert commit.conf == {"spark.b": "2"}  # commit_kwargs win over the group's spark_conf
    assert dag.get_task("d.commit").commit_mode is None  # the pipeline's
