"""airflow-provider-eo: exactly-once Kafka -> PySpark -> Kafka pipelines for Apache Airflow."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
