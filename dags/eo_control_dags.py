"""The DAGs the Exactly-once page's buttons trigger, for the example pipeline: ``eo_savepoint``
(**Take savepoint**) and ``eo_control`` (**Stop** / **Resume**). **Trigger DAG** shows the same
forms. In your deployment, list your own pipelines (see
:mod:`airflow_provider_eo.control_dags`)."""

from __future__ import annotations

from airflow_provider_eo.control_dags import eo_control_dags

savepoint_dag, control_dag = eo_control_dags(
    pipelines=["eo_demo_pipelines:demo_pipeline"], tags=["eo", "example"]
)
