"""The packaged DAGs the Exactly-once page's buttons trigger (eo_control_dags)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_provider_eo.control_dags import eo_control_dags
from airflow_provider_eo.pipeline import PipelineConfigError


def _validate(params: Any, conf: dict[str, Any]) -> None:
    merged = copy.deepcopy(params)
    merged.update(conf)
    merged.validate()


def test_both_dags_offer_exactly_the_listed_pipelines() -> None:
    from airflow.sdk.exceptions import ParamValidationError

    savepoint, control = eo_control_dags(
        pipelines=["mypkg.pipelines:ORDERS", "mypkg.pipelines:PAYMENTS"],
        savepoint_dag_id="orders_savepoint",
        control_dag_id="orders_control",
        kafka_conn_id="kafka_prod",
        ledger_conn_id="eo_ledger_prod",
        wait_seconds=120,
        dag_kwargs={"max_active_runs": 1},
    )
    assert (savepoint.dag_id, control.dag_id) == ("orders_savepoint", "orders_control")
    for dag in (savepoint, control):
        assert dag.schedule is None or str(dag.schedule) == "None"
        assert dag.params["pipeline"] == "mypkg.pipelines:ORDERS" and dag.max_active_runs == 1
        with pytest.raises(ParamValidationError):
            _validate(dag.params, {"pipeline": "other:P", "name": "sp1"})
    _validate(savepoint.params, {"pipeline": "mypkg.pipelines:PAYMENTS", "name": "sp1"})
    _validate(control.params, {"pipeline": "mypkg.pipelines:PAYMENTS", "action": "resume"})
    assert savepoint.params["wait_seconds"] == 120
    for task in (savepoint.get_task("savepoint"), control.get_task("control")):
        assert task.pipeline == "{{ params.pipeline }}"
        assert (task.kafka_conn_id, task.ledger_conn_id) == ("kafka_prod", "eo_ledger_prod")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pipelines": []}, "at least one"),
        ({"pipelines": ["orders"]}, r"'module:ATTR'.*\['orders'\]"),
        ({"pipelines": ["m:P"], "dag_kwargs": {"schedule": "@daily"}}, "run when triggered"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_change(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineConfigError, match=match):
        eo_control_dags(**kwargs)
