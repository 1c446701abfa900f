#!/usr/bin/env bash
# Every run behind benchmarks/mupfl/RESULTS.md, then the report.
# Resumable: finished runs are skipped, so rerunning this continues where it stopped.
# Two lanes of one run each keep both cores of the 2-core machine busy. Both lanes end with
# Table II; they share its runs through the sweep's per-run claims (a run the other lane has
# started is skipped), so every run is run once.
set -uo pipefail
cd "$(dirname "$0")/../.."
sweep() { .venv/bin/fedtail sweep "$@"; }
lane() {
  local failed=0
  for file in "$@"; do sweep "benchmarks/mupfl/$file" --jobs 1 || failed=1; done
  return $failed
}
sweep benchmarks/mupfl/validation_fmnist.toml || exit 1   # chooses the open hyperparameters first
lane table6_fmnist.toml table2_fmnist.toml & first=$!
lane table5_fmnist.toml table2_fmnist.toml & second=$!
status=0
wait $first || status=1
wait $second || status=1
bash benchmarks/mupfl/report.sh
exit $status
