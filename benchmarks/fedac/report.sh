#!/usr/bin/env bash
# Regenerates benchmarks/fedac/PROBE.md and VALIDATION.md (and their plots) from the run folders.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report \
  --sweep benchmarks/fedac/probe_fmnist.toml \
  --out benchmarks/fedac/PROBE.md \
  --title "FedAC and baselines on Fashion-MNIST: 30-round cost probe" \
  --command "fedtail sweep benchmarks/fedac/probe_fmnist.toml"
.venv/bin/fedtail report \
  --sweep benchmarks/fedac/validation_fmnist.toml \
  --out benchmarks/fedac/VALIDATION.md \
  --title "FedAC and baselines on Fashion-MNIST: validation runs for the open hyperparameters" \
  --command "fedtail sweep benchmarks/fedac/validation_fmnist.toml"
.venv/bin/fedtail report \
  --sweep benchmarks/fedac/validation1000_fmnist.toml \
  --out benchmarks/fedac/VALIDATION1000.md \
  --title "FedAC and baselines on Fashion-MNIST: validation at the full 1000-round budget" \
  --command "fedtail sweep benchmarks/fedac/validation1000_fmnist.toml"
