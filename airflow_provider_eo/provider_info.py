"""What Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_eo import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata: hooks, operators, sensors, triggers, connection types and
    the ``[eo]`` options (read by the Exactly-once page; ``airflow config list`` shows them)."""
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
                    "airflow_provider_eo.operators.query",
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
                    "airflow_provider_eo.triggers.source",
                    "airflow_provider_eo.triggers.stream",
                ],
            }
        ],
        # From a plan/commit task to the checkpoint on the "Exactly-once" page.
        "extra-links": ["airflow_provider_eo.ui.links.EoCheckpointLink"],
        "config": {"eo": EO_CONFIG_SECTION},
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


#: The ``[eo]`` section: every option the provider reads (ui/app.py), as Airflow declares
#: provider options (shown by ``airflow config list``, defaults for ``conf.get``).
EO_CONFIG_SECTION: dict[str, Any] = {
    "description": "The Exactly-once page (Browse -> Exactly-once) of airflow-provider-eo: "
    "which ledger it reads, where lag comes from, which DAGs its buttons trigger.",
    "options": {
        "ledger_conn_id": {
            "description": "An eo_ledger (or postgres) connection naming the ledger the page "
            "reads (read-only). Unset: $EO_LEDGER_CONN_ID, else $EO_LEDGER_URL, else the eo "
            "home's SQLite ledger.",
            "version_added": "0.1.0",
            "type": "string",
            "example": "eo_ledger_default",
            "default": None,
        },
        "kafka_conn_id": {
            "description": "A kafka connection lag is read through. Unset: $EO_KAFKA_CONN_ID, "
            "else $EO_KAFKA_BOOTSTRAP, else lag shows 'unavailable'.",
            "version_added": "0.1.0",
            "type": "string",
            "example": "kafka_default",
            "default": None,
        },
        "savepoint_dag_id": {
            "description": "The DAG the page's savepoint button triggers.",
            "version_added": "0.1.0",
            "type": "string",
            "example": None,
            "default": "eo_savepoint",
        },
        "control_dag_id": {
            "description": "The DAG the page's stop/resume/restore/reset buttons trigger.",
            "version_added": "0.1.0",
            "type": "string",
            "example": None,
            "default": "eo_control",
        },
    },
}
