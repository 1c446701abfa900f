#!/usr/bin/env bash
# Every run behind benchmarks/mupfl/RESULTS.md and VALIDATION2.md, then the report, in two steps:
#   bash benchmarks/mupfl/run_all.sh [LIMIT]            the validation sweeps (they choose the values)
#   bash benchmarks/mupfl/run_all.sh --tables [LIMIT]   Tables II, V and VI, then the report
# Between the two, the validation winners go into the table files by hand (README.md, "Status"),
# and finished table runs whose options that changes are moved to runs/superseded/ (a stale run
# stops its sweep). --tables refuses to start while a validation run is left (pending, partial,
# stale or busy), so no table runs with a value validation has not decided.
# Resumable: finished runs are skipped, so rerunning this continues where it stopped.
# Two lanes of one run each keep both cores of the 2-core machine busy. Both lanes end with
# Table II; they share its runs through the sweep's per-run claims (a run the other lane has
# started is skipped), so every run is run once.
# Optional LIMIT, a time limit for this sitting (e.g. `run_all.sh 2h30m`): runs not expected to
# end within it are left for the next sitting (fedtail sweep --time-limit).
set -uo pipefail
cd "$(dirname "$0")/../.."
tables=0
if [ "${1:-}" = "--tables" ]; then tables=1; shift; fi
deadline=""
if [ $# -gt 0 ]; then
  limit_min=$(.venv/bin/python - "$1" <<'PY'
import sys
from fedtail.cli.sweep_cmd import parse_duration
from fedtail.errors import ConfigError
try:
    print(int(parse_duration(sys.argv[1])))
except ConfigError as err:
    sys.exit(f"run_all.sh: {err}")
PY
) || exit 2
  deadline=$(( $(date +%s) + 60 * limit_min ))
fi
sweep() {
  if [ -z "$deadline" ]; then .venv/bin/fedtail sweep "$@"; return; fi
  local left=$(( (deadline - $(date +%s)) / 60 ))
  if [ "$left" -le 0 ]; then echo "time limit reached: $1 left for the next sitting"; return 0; fi
  .venv/bin/fedtail sweep "$@" --time-limit "${left}m"
}
lane() {
  local failed=0
  for file in "$@"; do sweep "benchmarks/mupfl/$file" --jobs 1 || failed=1; done
  return $failed
}
validation="validation_fmnist.toml validation2_fmnist.toml validation2_mupfl_fmnist.toml"
if [ $tables = 0 ]; then
  sweep benchmarks/mupfl/validation_fmnist.toml || exit 1   # the first grid (20 rounds), kept for the record
  # issue 16: the readings, BAVD and the baselines' options at the full budget, then MuPFL's tau, m, kappa
  sweep benchmarks/mupfl/validation2_fmnist.toml --jobs 2 || exit 1
  sweep benchmarks/mupfl/validation2_mupfl_fmnist.toml --jobs 2 || exit 1
  echo "run_all.sh: validation done for this sitting; put its winners into the table files, then run_all.sh --tables"
  exit 0
fi
for file in $validation; do   # the tables wait for every choice
  if ! .venv/bin/fedtail sweep "benchmarks/mupfl/$file" --dry-run | tail -n 1 | grep -q " 0 pending, 0 stale, 0 busy, 0 partial"; then
    echo "run_all.sh: $file has runs left; the tables wait for its choices (README.md)"; exit 1
  fi
done
lane table6_fmnist.toml table2_fmnist.toml & first=$!
lane table5_fmnist.toml table2_fmnist.toml & second=$!
status=0
wait $first || status=1
wait $second || status=1
bash benchmarks/mupfl/report.sh
exit $status
