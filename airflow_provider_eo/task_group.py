"""One call puts a pipeline's four steps in a DAG: ``plan >> prepare >> wait >> commit``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

from airflow_provider_eo.version_compat import Asset, TaskGroup

log = logging.getLogger(__name__)

#: The plan task's default ``restore_from``: the run conf's (or the DAG Param's)
#: ``restore_from``; renders "" when neither is set.
RESTORE_FROM_CONF = "{{ params.get('restore_from') or '' }}"


def eo_pipeline_group(
    pipeline_ref: str,
    *,
    group_id: str = "eo",
    spark_conn_id: str = "spark_default",
    kafka_conn_id: str | None = None,
    ledger_conn_id: str | None = None,
    deferrable: bool | None = None,
    poke_interval: float = 5.0,
    timeout: float = 3600.0,
    retries: int | None = None,
    retry_delay: timedelta | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    deploy_mode: str | None = None,
    plan_kwargs: Mapping[str, Any] | None = None,
    prepare_kwargs: Mapping[str, Any] | None = None,
    wait_kwargs: Mapping[str, Any] | None = None,
    commit_kwargs: Mapping[str, Any] | None = None,
    commit_mode: str | None = None,
    restore_from: str | None = RESTORE_FROM_CONF,
    sink_asset: Asset | Literal["auto"] | None = None,
    **group_kwargs: Any,
) -> TaskGroup:
    """A TaskGroup running one checkpoint of ``pipeline_ref`` per DAG run.

    ``plan`` (:class:`~airflow_provider_eo.operators.plan.EoPlanOperator`) plans or resumes
    the checkpoint; ``prepare`` (:class:`~airflow_provider_eo.operators.submit.EoSubmitOperator`)
    runs the Spark job; ``wait``
    (:class:`~airflow_provider_eo.sensors.checkpoint.EoCheckpointSensor`) waits until the
    ledger shows it PREPARED; ``commit``
    (:class:`~airflow_provider_eo.operators.commit.EoCommitOperator`) publishes it exactly
    once. Every step is idempotent, so a retried or cleared task, or the next DAG run,
    continues the same unfinished checkpoint. Nothing is imported or contacted at parse
    time: the pipeline is loaded by each task when it runs (``sink_asset="auto"`` is the one
    exception, below).

    With ``sink_asset``, the commit task has the pipeline's sink topic as an outlet and each
    committed checkpoint is an asset event other DAGs can be scheduled on
    (:mod:`airflow_provider_eo.assets`).

    The group runs whatever schedule its DAG has. To run when the source has data instead
    of on a timetable, schedule the DAG on the pipeline's source asset:
    ``DAG(..., schedule=[source_asset(pipeline_ref)], max_active_runs=1)``
    (:func:`~airflow_provider_eo.assets.source_asset`: its watcher fires once per planned
    position while records wait, nothing while the source is idle).

    A run whose conf (or DAG ``Param``) has ``"restore_from": "<savepoint>"`` restores
    the pipeline from that savepoint in its plan task first (once per run, even across
    retries); a stopped pipeline makes the plan task, and so the run, skip.

    Call it inside ``with DAG(...)`` (or pass ``dag=``). Schedule the DAG with
    ``max_active_runs=1``: two runs planning at once are refused by the ledger.

    :param pipeline_ref: ``"module:ATTR"`` of the Pipeline (or of a callable returning one).
    :param group_id: the TaskGroup id (task ids become ``{group_id}.plan`` ...).
    :param spark_conn_id: Spark connection of the prepare job (and of a spark-mode commit).
    :param kafka_conn_id: optional ``kafka`` connection merged over the pipeline's config.
    :param ledger_conn_id: optional ``eo_ledger`` connection replacing the ledger URL.
    :param deferrable: the sensor waits in the triggerer or pokes; ``None`` (default):
        Airflow's ``[operators] default_deferrable``.
    :param poke_interval: seconds between ledger reads of the sensor/trigger.
    :param timeout: seconds the sensor waits for PREPARED.
    :param retries: retries of every step (a retry resumes the same checkpoint); ``None``
        (default): the DAG's ``default_args`` (else Airflow's ``default_task_retries``).
    :param retry_delay: delay between retries; ``None``: the DAG's ``default_args``.
    :param spark_conf: extra ``--conf`` of the spark-submits (the prepare's, and the
        commit's in spark mode).
    :param deploy_mode: ``client`` or ``cluster`` (overrides the Spark connection's).
    :param plan_kwargs: extra arguments of the plan operator.
    :param prepare_kwargs: extra arguments of the submit operator (``env_vars``, ``jars`` ...).
    :param wait_kwargs: extra arguments of the sensor (``mode``, ``check_before_defer`` ...).
    :param commit_kwargs: extra arguments of the commit operator (e.g. its own ``conf``).
    :param commit_mode: where the commit's shard transactions run: ``"local"`` (the Airflow
        worker), ``"spark"`` (a spark-submit of the commit application, on executors),
        ``"auto"``, or ``None`` for the pipeline's ``commit_mode`` (see
        :class:`~airflow_provider_eo.operators.commit.EoCommitOperator`).
    :param restore_from: template (or name) of a savepoint the plan task restores from
        first; default the run conf's ``restore_from``; ``None`` never restores.
    :param sink_asset: the commit task's outlet: an ``Asset`` (from
        :func:`~airflow_provider_eo.assets.sink_asset` or
        :func:`~airflow_provider_eo.assets.kafka_asset`), or ``"auto"`` to build it from
        the pipeline while the DAG is parsed (its module is imported and a factory called;
        no connection is read). ``"auto"`` wires no outlet, and logs why, for a pipeline that
        names its cluster only through ``kafka_conn_id``: pass the asset itself there.
        ``None`` (default): no outlet.
    :param group_kwargs: passed to :class:`TaskGroup` (``dag``, ``tooltip``, ``parent_group`` ...).
    """
    from airflow_provider_eo.operators.commit import EoCommitOperator
    from airflow_provider_eo.operators.plan import EoPlanOperator
    from airflow_provider_eo.operators.submit import EoSubmitOperator
    from airflow_provider_eo.sensors.checkpoint import EoCheckpointSensor

    outlet = _sink_outlet(pipeline_ref, sink_asset)
    if outlet is not None:
        commit_kwargs = {
            **(commit_kwargs or {}),
            "outlets": [*list((commit_kwargs or {}).get("outlets") or []), outlet],
        }
    group_kwargs.setdefault("tooltip", f"exactly-once checkpoint of {pipeline_ref}")
    # Only what the caller gave: else the DAG's default_args (and Airflow's defaults) apply.
    common: dict[str, Any] = {
        k: v for k, v in (("retries", retries), ("retry_delay", retry_delay)) if v is not None
    }
    with TaskGroup(group_id=group_id, **group_kwargs) as group:
        plan = EoPlanOperator(
            task_id="plan",
            pipeline=pipeline_ref,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
            restore_from=restore_from,
            **{**common, **(plan_kwargs or {})},
        )
        checkpoint = f"{{{{ ti.xcom_pull(task_ids='{plan.task_id}')['checkpoint_id'] }}}}"
        prepare = EoSubmitOperator(
            task_id="prepare",
            pipeline=pipeline_ref,
            checkpoint_id=checkpoint,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
            conn_id=spark_conn_id,
            conf=dict(spark_conf or {}),
            deploy_mode=deploy_mode,
            **{**common, **(prepare_kwargs or {})},
        )
        wait = EoCheckpointSensor(
            task_id="wait",
            pipeline=pipeline_ref,
            checkpoint_id=checkpoint,
            ledger_conn_id=ledger_conn_id,
            deferrable=deferrable,
            poke_interval=poke_interval,
            timeout=timeout,
            **{**common, **(wait_kwargs or {})},
        )
        commit = EoCommitOperator(
            task_id="commit",
            pipeline=pipeline_ref,
            checkpoint_id=checkpoint,
            kafka_conn_id=kafka_conn_id,
            ledger_conn_id=ledger_conn_id,
            **{
                **common,
                "commit_mode": commit_mode,
                "conn_id": spark_conn_id,
                "conf": dict(spark_conf or {}),
                "deploy_mode": deploy_mode,
                **(commit_kwargs or {}),
            },
        )
        plan >> prepare >> wait >> commit
    return group


def _sink_outlet(pipeline_ref: str, sink_asset: Asset | str | None) -> Asset | None:
    """The commit task's sink outlet for ``eo_pipeline_group``'s ``sink_asset``."""
    if sink_asset is None or isinstance(sink_asset, Asset):
        return sink_asset
    if sink_asset != "auto":
        raise ValueError(f"sink_asset must be an Asset, 'auto' or None, got {sink_asset!r}")
    from airflow_provider_eo import assets
    from airflow_provider_eo.pipeline import load_pipeline

    pipeline = load_pipeline(pipeline_ref)
    if not pipeline.kafka.get("bootstrap.servers"):
        log.warning(
            "pipeline %s (%s): no sink asset outlet: the pipeline names its Kafka cluster only "
            "through the connection %r, which is not read while a DAG is parsed; pass "
            "sink_asset=sink_asset(%r, bootstrap='host:port')",
            pipeline.name,
            pipeline_ref,
            pipeline.kafka_conn_id,
            pipeline_ref,
        )
        return None
    return assets.sink_asset(pipeline)
