#!/usr/bin/env bash
# Regenerates benchmarks/gldp/RESULTS.md, VALIDATION.md and PROBE.md (and their figures) from the run folders.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report \
  --sweep benchmarks/gldp/tables23_fmnist.toml --sweep benchmarks/gldp/table4_fmnist.toml \
  --sweep benchmarks/gldp/table1_fmnist.toml \
  --reference benchmarks/gldp/paper_cifar10.toml \
  --out benchmarks/gldp/RESULTS.md \
  --title "GLDP (STHFL) and baselines on Fashion-MNIST: Tables 1-4 and Figures 3-4 analogues"
.venv/bin/fedtail report \
  --sweep benchmarks/gldp/validation_fmnist.toml \
  --sweep benchmarks/gldp/validation_spatial_fmnist.toml \
  --out benchmarks/gldp/VALIDATION.md \
  --title "GLDP and baselines on Fashion-MNIST: validation runs for the open hyperparameters"
.venv/bin/fedtail report \
  --sweep benchmarks/gldp/probe_fmnist.toml \
  --out benchmarks/gldp/PROBE.md \
  --title "GLDP and baselines on Fashion-MNIST: cost probe (2 rounds of global optimisation)"
