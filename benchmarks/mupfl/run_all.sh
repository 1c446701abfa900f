#!/usr/bin/env bash
# Every run behind benchmarks/mupfl/RESULTS.md and VALIDATION2.md, then the report.
# The tables' values come from the validation sweeps: after those, their winners go into the
# table files (README.md) before the tables run.
# Resumable: finished runs are skipped, so rerunning this continues where it stopped.
# Two lanes of one run each keep both cores of the 2-core machine busy. Both lanes end with
# Table II; they share its runs through the sweep's per-run claims (a run the other lane has
# started is skipped), so every run is run once.
# Optional first argument, a time limit for this sitting (e.g. `run_all.sh 2h30m`): runs not
# expected to end within it are left for the next sitting (fedtail sweep --time-limit).
set -uo pipefail
cd "$(dirname "$0")/../.."
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
sweep benchmarks/mupfl/validation_fmnist.toml || exit 1   # chooses the open hyperparameters first
# issue 16: the readings, BAVD and the baselines' options at the full budget, then MuPFL's tau, m, kappa
sweep benchmarks/mupfl/validation2_fmnist.toml --jobs 2 || exit 1
sweep benchmarks/mupfl/validation2_mupfl_fmnist.toml --jobs 2 || exit 1
for file in validation2_fmnist.toml validation2_mupfl_fmnist.toml; do   # the tables wait for every choice
  if ! .venv/bin/fedtail sweep "benchmarks/mupfl/$file" --dry-run | tail -n 1 | grep -q " 0 pending, 0 stale, 0 busy"; then
    echo "run_all.sh: $file has runs left; the tables wait for its choices (README.md)"; exit 0
  fi
done
lane table6_fmnist.toml table2_fmnist.toml & first=$!
lane table5_fmnist.toml table2_fmnist.toml & second=$!
status=0
wait $first || status=1
wait $second || status=1
bash benchmarks/mupfl/report.sh
exit $status
