"""What Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_eo import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata: hooks, operators, sensors, triggers and connection types.

    Only what exists: no ``config`` section, since the provider reads no ``[eo]`` option
    (a pipeline names its ledger; an ``eo_ledger`` connection can replace it).
    """
    return {
        "package-name": "airflow-provider-eo",
        "name": "Exactly-once Kafka/Spark (eo)",
        "description": "Exactly-once Kafka -> PySpark -> Kafka pipelines with checkpoints, "
        "two-phase commit, a queryable ledger and an audit.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Exactly-once Kafka/Spark (eo)",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Exactly-once Kafka/Spark (eo)",
                "python-modules": [
                    "airflow_provider_eo.hooks.ledger",
                    "airflow_provider_eo.hooks.kafka",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Exactly-once Kafka/Spark (eo)",
                "python-modules": [
                    "airflow_provider_eo.operators.plan",
                    "airflow_provider_eo.operators.submit",
                    "airflow_provider_eo.operators.commit",
                    "airflow_provider_eo.operators.abort",
                    "airflow_provider_eo.operators.savepoint",
                    "airflow_provider_eo.operators.control",
                    "airflow_provider_eo.operators.restore",
                    "airflow_provider_eo.operators.backfill",
                    "airflow_provider_eo.operators.stream",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Exactly-once Kafka/Spark (eo)",
                "python-modules": ["airflow_provider_eo.sensors.checkpoint"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Exactly-once Kafka/Spark (eo)",
                "python-modules": [
                    "airflow_provider_eo.triggers.checkpoint",
                    "airflow_provider_eo.triggers.stream",
                ],
            }
        ],
        # From a plan/commit task to the checkpoint on the "Exactly-once" page.
        "extra-links": ["airflow_provider_eo.ui.links.EoCheckpointLink"],
        # The page itself is an Airflow plugin registered by the ``airflow.plugins`` entry
        # point (plugins listed here load only with lazy provider discovery turned off).
        # EoKafkaHook reads the apache-kafka provider's "kafka" connections; registering
        # that type here too would clash when both providers are installed.
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_eo.hooks.ledger.LedgerHook",
                "connection-type": "eo_ledger",
                "hook-name": "EO checkpoint ledger",
                # The connection form, declared as Airflow >= 3.2 reads it (no wtforms, no
                # hook import): extra fields and the standard fields' labels/placeholders.
                "conn-fields": {
                    "sqlalchemy_url": {
                        "label": "SQLAlchemy URL",
                        "description": "The whole ledger URL (wins over the fields above), e.g. "
                        "postgresql+psycopg://user:pw@host:5432/eo. Stored like a password.",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "dialect": {
                        "label": "Dialect",
                        "description": "sqlite: Host is the ledger file's path; otherwise PostgreSQL.",
                        "schema": {"type": ["string", "null"], "enum": ["postgresql", "sqlite", None]},
                    },
                    "driver": {
                        "label": "SQLAlchemy driver",
                        "description": "Driver of a PostgreSQL ledger (default postgresql+psycopg).",
                        "schema": {"type": ["string", "null"]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"host": "Host (or SQLite file path)", "schema": "Database"},
                    "placeholders": {
                        "host": "127.0.0.1  or  /opt/airflow/eo/ledger.db",
                        "port": "5432",
                        "schema": "eo",
                        "login": "eo",
                    },
                },
            }
        ],
    }
