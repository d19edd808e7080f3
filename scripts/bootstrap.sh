#!/usr/bin/env bash
# Set up everything the demo and the tests need, from a fresh clone: a JDK + Maven (Debian
# packages, when missing), the virtualenv in .venv/ with the pinned dependencies, and the
# Kafka / Spark-connector / Hadoop test-cluster jars from Maven Central. Safe to run again: each step is skipped
# when already done.
#
# --python-only: only the virtualenv, the Spark Kafka connector's jars and eo's own Spark jar
# (what a Spark session needs); scripts/test.sh starts its Spark work after that and runs the
# rest (the other jars) meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
python_only=0
[ "${1:-}" = --python-only ] && python_only=1
say() { printf 'bootstrap: %s\n' "$*" >&2; }

missing=()
# javac too: eo compiles its Spark partitioner class on first use (a JRE alone falls back to Python).
command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
# The UI's browser test (scripts/test.sh sets EO_BOOTSTRAP_BROWSER=1; the demo does not
# need it): Debian's headless Chromium and its WebDriver.
browser=()
if [ "${EO_BOOTSTRAP_BROWSER:-0}" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || browser+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || browser+=(chromium-driver)
fi
if [ ${#browser[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing+=("${browser[@]}")
  else
    say "missing ${browser[*]}: the UI's browser test will fail until they are installed"
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} (Debian packages)"
    apt-get -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null
  else
    say "missing: ${missing[*]}; install them (Java 17+ and Maven) and rerun"; exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# The exact versions the tests run against (pyproject.toml only has lower bounds).
pyver=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
constraints=constraints/constraints-$pyver.txt
constraint_args=()
if [ -f "$constraints" ]; then
  constraint_args=(-c "$constraints")
else
  say "no $constraints for Python $pyver: installing the newest versions pyproject.toml allows"
fi
stamp=$(cat pyproject.toml "$constraints" 2>/dev/null | sha256sum | cut -c1-16)
if [ "$(cat .venv/.eo-installed 2>/dev/null || true)" != "$stamp" ]; then
  say "installing the package and its dependencies (${constraints}) into .venv (first run takes ~1 min)"
  # uv (a dev dependency, the version the constraints pin) installs the same set about twice
  # as fast as pip; pip >= 25.1 (PEP 735 dependency groups) when uv cannot be installed.
  # --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, every process would
  # otherwise compile Airflow, Spark's Python and the rest from source at each import.
  uv_pin=$(grep -m1 '^uv==' "$constraints" 2>/dev/null || echo uv)
  if .venv/bin/python -m pip install -q --disable-pip-version-check "$uv_pin"; then
    .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${constraint_args[@]}" -e . --group dev
    # pyspark comes only as a source distribution: uv builds it and keeps the build (~1.4 GB
    # with its unpacked source) in its cache; where the sdist's download is revalidated, each
    # install adds a new copy and the old ones stay. Drop what no cache entry points to (not
    # waiting long for another uv process that holds the cache).
    timeout 60 .venv/bin/uv cache prune -q 2>/dev/null || true
  else
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q "${constraint_args[@]}" -e . --group dev
  fi
  echo "$stamp" > .venv/.eo-installed
fi

say "fetching jars (cached under .eo/jars after the first run)"
EO_PYTHON_ONLY=$python_only .venv/bin/python - <<'PY'
import os
from airflow_provider_eo.stack.kafka import KAFKA_VERSION
from airflow_provider_eo.stack.javac import udf_jar
from airflow_provider_eo.stack.hadoop import minicluster_classpath
from airflow_provider_eo.stack.maven import hadoop_aws_jars, kafka_broker_jars, spark_kafka_jars
spark_kafka_jars()
udf_jar()
if os.environ["EO_PYTHON_ONLY"] != "1":
    kafka_broker_jars(KAFKA_VERSION)
    hadoop_aws_jars()  # staging on S3 (tests/integration/core/test_object_storage.py)
    minicluster_classpath()  # Spark on YARN, staging on HDFS (tests/integration/airflow/test_yarn.py)
PY
say "ready in $(( $(date +%s) - t0 ))s"
