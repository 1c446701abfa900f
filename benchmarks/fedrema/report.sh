#!/usr/bin/env bash
# Regenerates benchmarks/fedrema/RESULTS.md (Tables 1, 3 and 5), VALIDATION.md and PROBE.md (and
# their plots) from the run folders; a table whose runs have not finished shows "—" in its cells.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report \
  --sweep benchmarks/fedrema/table1_fmnist.toml \
  --sweep benchmarks/fedrema/table3_fmnist.toml \
  --sweep benchmarks/fedrema/table5_fmnist.toml \
  --reference benchmarks/fedrema/paper_fmnist.toml \
  --out benchmarks/fedrema/RESULTS.md \
  --title "FedReMa and its baselines on Fashion-MNIST: Tables 1, 3 and 5"
.venv/bin/fedtail report \
  --sweep benchmarks/fedrema/rounds_probe_fmnist.toml --sweep benchmarks/fedrema/validation_fmnist.toml \
  --out benchmarks/fedrema/VALIDATION.md \
  --title "FedReMa's baselines on Fashion-MNIST: validation runs for the open hyperparameters"
.venv/bin/fedtail report \
  --sweep benchmarks/fedrema/probe_fmnist.toml \
  --out benchmarks/fedrema/PROBE.md \
  --title "FedReMa and its Table 1 baselines on Fashion-MNIST: 10-round cost probe" \
  --command "fedtail sweep benchmarks/fedrema/probe_fmnist.toml"
# Table 2's rounds probe (issue 65): FedAvg for 500 rounds at 100 samples per client, validation data.
.venv/bin/fedtail report \
  --sweep benchmarks/fedrema/rounds_probe_table2_fmnist.toml \
  --out benchmarks/fedrema/ROUNDS_PROBE_TABLE2.md \
  --title "FedReMa's Table 2 on Fashion-MNIST: rounds probe"
