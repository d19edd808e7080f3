#!/usr/bin/env bash
# The README's test command runs this: lint, types, the import contracts, then every test
# against the real local services (Kafka broker, Spark, PostgreSQL, Airflow), which the
# fixtures start and stop.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests also need a headless Chromium for the UI's browser test (the demo does not).
EO_BOOTSTRAP_BROWSER=1 scripts/bootstrap.sh
echo "== ruff" >&2
.venv/bin/ruff check airflow_provider_eo tests dags bench
echo "== mypy" >&2
.venv/bin/mypy
echo "== import contracts" >&2
.venv/bin/lint-imports --no-cache --no-logo
echo "== pytest" >&2
# pytest exits 5 when it collects nothing; set -e turns that into a failure too.
# Two processes (pytest-xdist), whole files to each: most of the run is waiting on brokers,
# JVMs and subprocesses, not CPU. Each worker is a test session of its own (its own broker,
# Spark session and temp folders); a file's tests share its module fixtures in one worker.
# EO_TEST_WORKERS=0 runs everything in this process.
.venv/bin/pytest -q --timeout=1200 --durations=50 -n "${EO_TEST_WORKERS:-2}" --dist loadfile "$@"
