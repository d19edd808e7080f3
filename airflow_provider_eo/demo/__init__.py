"""``eo demo``: the README's main job on the embedded defaults (development aid, not the
provider's production path).

- :mod:`~airflow_provider_eo.demo.sample` creates the demo topics and produces the sample
  events;
- :mod:`~airflow_provider_eo.demo.direct` runs the pipeline by calling plan/prepare/commit
  (``eo demo --no-airflow``);
- :mod:`~airflow_provider_eo.demo.airflow` runs the example DAG under real Airflow 3
  (``eo demo``; needs the ``dags/`` folder of a source checkout);
- :mod:`~airflow_provider_eo.demo.render` prints what both show (the one place with rich
  tables of the demo and of ``eo audit``).

Nothing here imports :mod:`airflow_provider_eo.cli`; the CLI imports this package lazily,
inside its commands. This package imports nothing at import time.
"""
