"""``python -m airflow_provider_eo.cli``: the ``eo`` command."""

from airflow_provider_eo.cli import main

main()
