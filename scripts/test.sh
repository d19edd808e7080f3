#!/usr/bin/env bash
# The README's test command runs this: lint, types, the import contracts, then every test
# against the real local services (Kafka broker, Spark, PostgreSQL, Airflow), which the
# fixtures start and stop.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests also need a headless Chromium for the UI's browser test (the demo does not).
# First the virtualenv and the Spark connector (what the class archive below needs), then the
# other jars while the archive is made.
EO_BOOTSTRAP_BROWSER=1 scripts/bootstrap.sh --python-only
# Every process the tests start inherits this mark; whatever still carries it when the run
# ends (a worker stopped by a test's timeout skips its fixtures' teardown) is stopped here.
export EO_TEST_RUN="$$-$(date +%s)"
# Looked for again after each stop: a process may start one (a JVM) while it is stopped.
sweep() {
  local pids p round
  for round in 1 2 3; do
    pids=()
    for p in /proc/[0-9]*; do
      [ "${p#/proc/}" = $$ ] && continue
      if tr '\0' '\n' 2>/dev/null < "$p/environ" | grep -qx "EO_TEST_RUN=$EO_TEST_RUN"; then
        pids+=("${p#/proc/}")
      fi
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    echo "test run: stopping ${#pids[@]} processes the tests left running" >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
    sleep 5
    kill -KILL "${pids[@]}" 2>/dev/null || true
  done
}
# Spark's scratch folders (each driver's spark-<uuid>: its copies of the jars, ~10 MB) go to
# one folder of this run, removed at its end: a JVM a test kills leaves its own behind.
SPARK_LOCAL_DIRS=$(mktemp -d "${TMPDIR:-/tmp}/eo-test-spark.XXXXXX")
export SPARK_LOCAL_DIRS
trap 'sweep; rm -rf "$SPARK_LOCAL_DIRS"' EXIT
# Every Spark driver the tests start maps pyspark's classes from one archive (made once, ~30 s,
# a Spark job), made while the rest of the set-up and the linters run.
archive_log=$(mktemp)
.venv/bin/python tests/eo_jvm_archive.py >"$archive_log" 2>&1 &
archive_pid=$!
scripts/bootstrap.sh
echo "== ruff" >&2
.venv/bin/ruff check airflow_provider_eo tests dags bench
echo "== mypy" >&2
.venv/bin/mypy
echo "== import contracts" >&2
.venv/bin/lint-imports --no-cache --no-logo
wait "$archive_pid" || true  # without the archive the tests run, only slower
cat "$archive_log"
rm -f "$archive_log"
echo "== pytest" >&2
# pytest exits 5 when it collects nothing; set -e turns that into a failure too.
# Two processes (pytest-xdist), whole files to each (on two cores a third makes every test
# slower: the JVMs, Airflow and `eo` processes already keep both busy). Each worker has its
# own broker, Spark driver and temp folders; a file's tests share its module fixtures in one
# worker.
# EO_TEST_WORKERS=0 runs everything in this process.
# A test past its timeout has its stacks printed and its worker stopped (the thread method):
# a hung Spark or Kafka client would otherwise take every later test of that worker with it.
# pytest-xdist starts a fresh worker (its own broker and Spark session) for the rest.
# The session timeout ends the run with its summary before CI's limit would cut it off.
# Files are handed out in collection order, which tests/conftest.py sets longest first
# (pytest-xdist's own order, most tests first, left the one-test YARN file for last).
# Every test's time is kept in .eo/test-report.xml (JUnit XML; per file:
# scripts/test_times.py), and when it ran with the machine's CPU meanwhile in
# .eo/test-timeline.jsonl (scripts/test_times.py --timeline).
rm -f .eo/test-timeline.jsonl
export EO_TEST_TIMELINE="$PWD/.eo/test-timeline.jsonl"
.venv/bin/pytest -q --timeout=600 --timeout-method=thread --session-timeout=4800 --durations=50 \
  --junitxml=.eo/test-report.xml -n "${EO_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
