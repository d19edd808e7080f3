"""``eo demo``: the README's main job on the embedded defaults (development aid, not the
provider's production path).

- :mod:`~airflow_provider_eo.demo.sample` creates the demo topics and produces the sample
  events;
- :mod:`~airflow_provider_eo.demo.direct` runs the pipeline by calling plan/prepare/commit
  (``eo demo --no-airflow``);
- :mod:`~airflow_provider_eo.demo.airflow` runs the example DAG under real Airflow 3
  (``eo demo``; needs the ``dags/`` folder of a source checkout);
- both print through :mod:`airflow_provider_eo.render`, the one module with the rich tables
  of the demo and of the ``eo`` commands.

Nothing here imports :mod:`airflow_provider_eo.cli`; the CLI imports this package lazily,
inside its commands. This package imports nothing at import time.
"""
