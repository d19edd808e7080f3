"""``eo doctor``: preflight checks of one pipeline against its broker, ledger, staging and Spark.

Each check gives a :class:`Finding` (``ok`` / ``warn`` / ``fail``) saying what was found and
what to change. A ``fail`` means a checkpoint would fail (or be refused) as things are;
a ``warn`` means it would run but something needs attention. The report is safe to run
when nothing failed (:attr:`DoctorReport.safe`).

The doctor changes nothing: it never registers the pipeline, pins a prefix, migrates the
ledger, creates topics or fetches jars; its only write is a probe file in the staging dir,
removed at once. The decisions are pure functions (``judge_*``, unit-tested), one module
per concern: :mod:`.broker`, :mod:`.topics`, :mod:`.identity`, :mod:`.transactions`,
:mod:`.connector`, :mod:`.ledger`, :mod:`.staging`, :mod:`.query`. :mod:`.facts` gathers
the facts from the real services; :func:`run_doctor` (:mod:`.run`) calls the judges on
them. :mod:`.report` holds the findings and the report.
"""

from __future__ import annotations

from airflow_provider_eo.core.doctor.broker import judge_transaction_timeout
from airflow_provider_eo.core.doctor.connector import judge_connector
from airflow_provider_eo.core.doctor.identity import (
    judge_marker_group,
    judge_prefix,
    judge_same_name,
    transactional_namespace,
)
from airflow_provider_eo.core.doctor.ledger import judge_ledger
from airflow_provider_eo.core.doctor.query import QueryLocationFacts, judge_query
from airflow_provider_eo.core.doctor.report import (
    BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS,
    SEVERITIES,
    DoctorReport,
    Finding,
    Severity,
)
from airflow_provider_eo.core.doctor.run import run_doctor
from airflow_provider_eo.core.doctor.staging import judge_staging, judge_staging_shared
from airflow_provider_eo.core.doctor.topics import judge_sink_topic, judge_source_topics
from airflow_provider_eo.core.doctor.transactions import judge_open_transactions, judge_transactions

__all__ = [
    "BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS",
    "SEVERITIES",
    "DoctorReport",
    "Finding",
    "QueryLocationFacts",
    "Severity",
    "judge_connector",
    "judge_ledger",
    "judge_marker_group",
    "judge_open_transactions",
    "judge_prefix",
    "judge_query",
    "judge_same_name",
    "judge_sink_topic",
    "judge_source_topics",
    "judge_staging",
    "judge_staging_shared",
    "judge_transaction_timeout",
    "judge_transactions",
    "run_doctor",
    "transactional_namespace",
]
