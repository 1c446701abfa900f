#!/usr/bin/env bash
# Regenerates benchmarks/mupfl/RESULTS.md and its plots from the committed run folders.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report benchmarks/mupfl/runs/fmnist \
  --out benchmarks/mupfl/RESULTS.md \
  --reference benchmarks/mupfl/paper_fmnist.toml \
  --title "MuPFL on Fashion-MNIST: Tables II, V and VI" \
  --command "bash benchmarks/mupfl/run_all.sh"
