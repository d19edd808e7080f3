"""The provider's Spark applications: the files ``spark-submit`` runs as the driver.

``prepare`` (one checkpoint), ``commit`` (a checkpoint's commit as Spark jobs) and
``stream`` (streaming mode). Each loads the pipeline, applies the settings of its Airflow
connections (:func:`driver_pipeline`) and runs the protocol (core) with the Spark adapter.
Only these entry points may read Airflow connections; the code that runs on executors
(``airflow_provider_eo.spark``) never imports Airflow.
"""

from __future__ import annotations

import argparse

from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.runtime import resolve_pipeline

__all__ = ["add_connection_args", "driver_pipeline"]


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """``--kafka-conn-id`` / ``--ledger-conn-id``: connections given to the operator (ids only)."""
    parser.add_argument("--kafka-conn-id", default=None, help="Airflow kafka connection of the pipeline")
    parser.add_argument("--ledger-conn-id", default=None, help="Airflow connection of the ledger")


def driver_pipeline(
    ref: str, *, kafka_conn_id: str | None = None, ledger_conn_id: str | None = None
) -> Pipeline:
    """The pipeline ``ref`` as this driver must run it: with the connection settings an
    Airflow task handed over (client deploy mode: the file named by
    :data:`~airflow_provider_eo.names.CONNECTIONS_FILE_ENV`, read once and deleted), else
    with the connections read here (cluster deploy mode, ``spark-submit`` by hand: the
    secrets backend or ``AIRFLOW_CONN_*`` of this host):
    :func:`~airflow_provider_eo.runtime.resolve_pipeline` with ``handoff="env"``."""
    return resolve_pipeline(
        ref, kafka_conn_id=kafka_conn_id, ledger_conn_id=ledger_conn_id, handoff="env"
    ).pipeline
