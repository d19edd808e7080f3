#!/usr/bin/env bash
# Measure the set-up times the README publishes:
#   cold  = scripts/bootstrap.sh in a fresh clone with an empty pip cache and ~/.m2
#   warm  = scripts/bootstrap.sh again in that clone (everything cached)
#   broker = `eo dev up` on formatted storage (start until the broker answers), best of 3
# Usage: bench/setup.sh   (takes a few minutes; prints one machine-readable line at the end)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/eo-setup-bench.XXXX)
trap 'cd /; HOME=$work/home "$work/main/.venv/bin/eo" dev down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git clone -q "$src" "$work/main"
mkdir -p "$work/home"
# Java takes user.home from the passwd entry, not $HOME: point Maven at an empty repo.
export MAVEN_OPTS="-Dmaven.repo.local=$work/home/m2"
cd "$work/main"
now() { date +%s.%N; }
echo "cold set-up (empty pip cache and ~/.m2) ..." >&2
t=$(now); HOME=$work/home PIP_CACHE_DIR=$work/home/pip scripts/bootstrap.sh; cold=$(echo "$(now) - $t" | bc)
echo "warm set-up ..." >&2
t=$(now); HOME=$work/home PIP_CACHE_DIR=$work/home/pip scripts/bootstrap.sh; warm=$(echo "$(now) - $t" | bc)
HOME=$work/home .venv/bin/eo dev up >/dev/null; HOME=$work/home .venv/bin/eo dev down 2>/dev/null
best=999
for i in 1 2 3; do
  t=$(now); HOME=$work/home .venv/bin/eo dev up >/dev/null; s=$(echo "$(now) - $t" | bc)
  HOME=$work/home .venv/bin/eo dev down 2>/dev/null
  best=$(echo "if ($s < $best) $s else $best" | bc)
done
printf 'setup-bench: cold_s=%.1f warm_s=%.1f broker_start_s=%.1f\n' "$cold" "$warm" "$best"
