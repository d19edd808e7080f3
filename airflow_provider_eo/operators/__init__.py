"""Operators of the exactly-once provider: plan, prepare (spark-submit), commit, abort,
savepoint, restore and backfill.

Import the classes from their modules (``airflow_provider_eo.operators.plan`` ...);
this package imports nothing so that loading one operator stays cheap.
"""
