"""The Airflow UI's "Exactly-once" page: a plugin (FastAPI app + navigation entry) that shows
pipelines, checkpoint history, lag and savepoints from the ledger."""
