"""Take a savepoint of a pipeline from the Airflow UI: **Trigger DAG** shows a form.

- **pipeline**: the pipeline's ``module:ATTR`` (default the example pipeline of
  ``eo_pipeline``).
- **name**: the savepoint's name, unique per pipeline (letters, digits, ``.``, ``_``,
  ``-``; the form refuses anything else).
- **note**: free text kept with the savepoint.
- **stop**: stop the pipeline first: its DAG's runs skip from now on, the checkpoint in
  flight finishes, and the savepoint is taken once nothing is in flight. ``eo resume
  MODULE:ATTR`` starts it again.
- **wait_seconds**: longest wait for the in-flight checkpoint to commit.

The savepoint points at the newest COMMITTED checkpoint (the in-flight one once it
commits) and records this run (and the user who triggered it) as who took it. Restore
from it by triggering ``eo_pipeline`` with ``{"restore_from": "<name>"}``, or
``eo restore MODULE:ATTR --savepoint <name>``.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_provider_eo.operators.savepoint import SAVEPOINT_NAME_PATTERN, EoSavepointOperator

with DAG(
    dag_id="eo_savepoint",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["eo", "example", "savepoint"],
    doc_md=__doc__,
    params={
        "pipeline": Param(
            "eo_demo_pipelines:demo_pipeline",
            type="string",
            minLength=3,
            title="Pipeline",
            description="Import path MODULE:ATTR of the pipeline.",
        ),
        "name": Param(
            "",
            type="string",
            pattern=SAVEPOINT_NAME_PATTERN,
            title="Savepoint name",
            description="Unique per pipeline: letters, digits, '.', '_' and '-' (first a letter or digit).",
        ),
        "note": Param("", type="string", title="Note", description="Kept with the savepoint."),
        "stop": Param(
            False,
            type="boolean",
            title="Stop the pipeline",
            description="Stop the pipeline first; it stays stopped until `eo resume`.",
        ),
        "wait_seconds": Param(
            600,
            type="integer",
            minimum=0,
            title="Wait (seconds)",
            description="Longest wait for the checkpoint in flight to commit.",
        ),
    },
) as dag:
    EoSavepointOperator(
        task_id="savepoint",
        pipeline="{{ params.pipeline }}",
        savepoint_name="{{ params.name }}",
        note="{{ params.note }}",
        stop="{{ params.stop }}",
        wait_seconds="{{ params.wait_seconds }}",
    )
