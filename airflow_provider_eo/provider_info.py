"""What Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_eo import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata: hooks, operators, sensors, triggers, connection types, config."""
    return {
        "package-name": "airflow-provider-eo",
        "name": "Exactly-once Kafka/Spark (eo)",
        "description": "Exactly-once Kafka -> PySpark -> Kafka pipelines with checkpoints, "
        "two-phase commit, a queryable ledger, savepoints, backfills and an audit.",
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
                "python-modules": ["airflow_provider_eo.triggers.checkpoint"],
            }
        ],
        # EoKafkaHook reads the apache-kafka provider's "kafka" connections; registering
        # that type here too would clash when both providers are installed.
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_eo.hooks.ledger.LedgerHook",
                "connection-type": "eo_ledger",
            }
        ],
        "config": {
            "eo": {
                "description": "Settings of the exactly-once provider.",
                "options": {
                    "default_ledger_url": {
                        "description": "SQLAlchemy URL of the checkpoint ledger when a pipeline names none.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "postgresql+psycopg://eo@db/eo",
                        "default": "sqlite:///eo-ledger.db",
                    },
                },
            }
        },
    }
