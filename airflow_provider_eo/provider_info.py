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
        "hooks": [],
        "operators": [],
        "sensors": [],
        "triggers": [],
        "connection-types": [],
        "config": {
            "eo": {
                "description": "Settings of the exactly-once provider.",
                "options": {
                    "default_ledger_url": {
                        "description": "SQLAlchemy URL of the checkpoint ledger when a "
                        "pipeline names none.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "postgresql+psycopg://eo@db/eo",
                        "default": "sqlite:///eo-ledger.db",
                    },
                },
            }
        },
    }
