"""Stop or resume a pipeline from the Airflow UI (the "Exactly-once" page's Stop and Resume
buttons trigger this DAG through Airflow's REST API; **Trigger DAG** shows the same form).

- **pipeline**: the pipeline's ``module:ATTR``.
- **action**: ``stop`` (plan refuses new checkpoints; the one in flight still prepares and
  commits) or ``resume``.
- **reason**: kept in the ledger with the stop.

The same as ``eo stop MODULE:ATTR`` / ``eo resume MODULE:ATTR``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_eo.operators.control import EoPipelineControlOperator

with DAG(
    dag_id="eo_control",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["eo", "example"],
    doc_md=__doc__,
    params={
        "pipeline": Param(
            "eo_demo_pipelines:demo_pipeline",
            type="string",
            minLength=3,
            title="Pipeline",
            description="Import path MODULE:ATTR of the pipeline.",
        ),
        "action": Param("stop", type="string", enum=["stop", "resume"], title="Action"),
        "reason": Param("", type="string", title="Reason", description="Kept with the stop."),
    },
) as dag:
    EoPipelineControlOperator(
        task_id="control",
        pipeline="{{ params.pipeline }}",
        action="{{ params.action }}",
        reason="{{ params.reason }}",
    )
