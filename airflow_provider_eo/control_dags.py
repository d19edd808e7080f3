"""The DAGs the Exactly-once page's buttons trigger, shipped in the package.

The page's **Take savepoint**, **Stop** and **Resume** buttons trigger two DAGs through
Airflow's REST API: ``eo_savepoint`` (Params ``pipeline``, ``name``, ``note``, ``stop``,
``wait_seconds``) and ``eo_control`` (Params ``pipeline``, ``action``, ``reason``). One call in
a DAG file of your deployment builds both for your pipelines:

.. code-block:: python

    # dags/eo_control_dags.py
    from airflow_provider_eo.control_dags import eo_control_dags

    savepoint_dag, control_dag = eo_control_dags(
        pipelines=["mypkg.pipelines:ORDERS", "mypkg.pipelines:PAYMENTS"],
        ledger_conn_id="eo_ledger_default",
    )

Their ``pipeline`` Param offers exactly the listed pipelines (the form shows a list; a
trigger naming any other is refused by Airflow's Param validation before a task runs), the
first one by default. ``[eo] savepoint_dag_id`` / ``[eo] control_dag_id`` tell the page other
ids when you pass ``savepoint_dag_id=`` / ``control_dag_id=``. Nothing is imported or read
while the DAG file is parsed: the tasks load the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow_provider_eo.pipeline import PipelineConfigError

#: The ids the Exactly-once page triggers unless ``[eo]`` says otherwise.
SAVEPOINT_DAG_ID = "eo_savepoint"
CONTROL_DAG_ID = "eo_control"

_SAVEPOINT_DOC = """Take a savepoint of a pipeline (the Exactly-once page's **Take savepoint**
button; **Trigger DAG** shows the same form).

- **pipeline**: which pipeline (``module:ATTR``).
- **name**: the savepoint's name, unique per pipeline (letters, digits, ``.``, ``_``, ``-``).
- **note**: free text kept with the savepoint.
- **stop**: stop the pipeline first: the checkpoint in flight finishes, the savepoint is taken
  once nothing is in flight, and the pipeline stays stopped until resumed.
- **wait_seconds**: longest wait for the in-flight checkpoint to commit.

The savepoint points at the newest COMMITTED checkpoint and records this run (and who
triggered it). Restore from it with ``eo restore MODULE:ATTR --savepoint <name>`` or the
pipeline DAG's ``restore_from`` Param.
"""

_CONTROL_DOC = """Stop or resume a pipeline (the Exactly-once page's **Stop** and **Resume**
buttons; **Trigger DAG** shows the same form).

- **pipeline**: which pipeline (``module:ATTR``).
- **action**: ``stop`` (no new checkpoint is planned; the one in flight still finishes) or
  ``resume``.
- **reason**: kept in the ledger with the stop.

The same as ``eo stop MODULE:ATTR`` / ``eo resume MODULE:ATTR``.
"""


def eo_control_dags(
    *,
    pipelines: Sequence[str],
    savepoint_dag_id: str = SAVEPOINT_DAG_ID,
    control_dag_id: str = CONTROL_DAG_ID,
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    wait_seconds: int = 600,
    tags: Sequence[str] = ("eo",),
    dag_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The savepoint DAG and the stop/resume DAG for ``pipelines`` (see the module docstring).

    :param pipelines: the pipelines' ``"module:ATTR"`` references, the first one the form's
        default. Not imported here.
    :param savepoint_dag_id: the savepoint DAG's id (the page's ``[eo] savepoint_dag_id``).
    :param control_dag_id: the stop/resume DAG's id (the page's ``[eo] control_dag_id``).
    :param kafka_conn_id: the tasks' Kafka connection, when not the pipelines' own.
    :param ledger_conn_id: the tasks' ledger connection, when not the pipelines' own.
    :param wait_seconds: the savepoint form's default wait for the in-flight checkpoint.
    :param tags: the DAGs' tags.
    :param dag_kwargs: more ``DAG(...)`` arguments for both (``access_control``, ``owner_links``,
        ...); ``schedule`` stays ``None``: these DAGs run when triggered.
    :returns: ``(savepoint_dag, control_dag)``; assign both at module level of the DAG file.
    """
    from airflow.sdk import DAG, Param

    from airflow_provider_eo.operators.control import EoPipelineControlOperator
    from airflow_provider_eo.operators.savepoint import SAVEPOINT_NAME_PATTERN, EoSavepointOperator

    refs = [str(p) for p in pipelines]
    bad = [r for r in refs if ":" not in r]
    if not refs or bad:
        raise PipelineConfigError(
            "eo_control_dags(pipelines=...) takes the pipelines' 'module:ATTR' references "
            f"(e.g. 'mypkg.pipelines:ORDERS'), at least one; got {bad or refs!r}"
        )
    extra = dict(dag_kwargs or {})
    if extra.pop("schedule", None) is not None:
        raise PipelineConfigError("eo_control_dags: these DAGs run when triggered; do not give a schedule")
    conns: dict[str, Any] = {"kafka_conn_id": kafka_conn_id, "ledger_conn_id": ledger_conn_id}

    def pipeline_param() -> Any:
        return Param(
            refs[0],
            type="string",
            enum=refs,
            title="Pipeline",
            description="Import path MODULE:ATTR of the pipeline.",
        )

    common: dict[str, Any] = {
        "schedule": None,
        "start_date": datetime(2025, 1, 1),
        "catchup": False,
        "tags": list(tags),
        **extra,
    }
    with DAG(
        dag_id=savepoint_dag_id,
        doc_md=_SAVEPOINT_DOC,
        params={
            "pipeline": pipeline_param(),
            "name": Param(
                "",
                type="string",
                pattern=SAVEPOINT_NAME_PATTERN,
                title="Savepoint name",
                description="Unique per pipeline: letters, digits, '.', '_', '-' (first a letter or digit).",
            ),
            "note": Param("", type="string", title="Note", description="Kept with the savepoint."),
            "stop": Param(
                False,
                type="boolean",
                title="Stop the pipeline",
                description="Stop the pipeline first; it stays stopped until resumed.",
            ),
            "wait_seconds": Param(
                wait_seconds,
                type="integer",
                minimum=0,
                title="Wait (seconds)",
                description="Longest wait for the checkpoint in flight to commit.",
            ),
        },
        **common,
    ) as savepoint_dag:
        EoSavepointOperator(
            task_id="savepoint",
            pipeline="{{ params.pipeline }}",
            savepoint_name="{{ params.name }}",
            note="{{ params.note }}",
            stop="{{ params.stop }}",
            wait_seconds="{{ params.wait_seconds }}",
            **conns,
        )
    with DAG(
        dag_id=control_dag_id,
        doc_md=_CONTROL_DOC,
        params={
            "pipeline": pipeline_param(),
            "action": Param("stop", type="string", enum=["stop", "resume"], title="Action"),
            "reason": Param("", type="string", title="Reason", description="Kept with the stop."),
        },
        **common,
    ) as control_dag:
        EoPipelineControlOperator(
            task_id="control",
            pipeline="{{ params.pipeline }}",
            action="{{ params.action }}",
            reason="{{ params.reason }}",
            **conns,
        )
    return savepoint_dag, control_dag
