#!/usr/bin/env bash
# Every run behind benchmarks/mupfl/RESULTS.md, in priority order, then the report.
# Resumable: finished runs are skipped, so rerunning this continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
sweep() { .venv/bin/fedtail sweep "$@"; }
sweep benchmarks/mupfl/validation_fmnist.toml   # chooses the open hyperparameters first
sweep benchmarks/mupfl/table2_fmnist.toml --settings a0.5-if10 --methods mupfl
sweep benchmarks/mupfl/table2_fmnist.toml --settings a0.5-if10
sweep benchmarks/mupfl/table6_fmnist.toml
sweep benchmarks/mupfl/table5_fmnist.toml
sweep benchmarks/mupfl/table2_fmnist.toml
bash benchmarks/mupfl/report.sh
