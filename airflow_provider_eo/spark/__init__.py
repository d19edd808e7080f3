"""The PySpark side: builds sessions and prepares checkpoints. Never imports Airflow."""
