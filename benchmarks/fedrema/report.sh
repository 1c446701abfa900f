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
# Issue 65's tables and figures, each its own document; cells without finished runs show "—".
report() {  # report SWEEP-STEM OUT-STEM TITLE [fedtail report OPTION...]
  local sweep=$1 out=$2 title=$3
  shift 3
  .venv/bin/fedtail report --sweep "benchmarks/fedrema/$sweep.toml" --out "benchmarks/fedrema/$out.md" \
    --title "$title" --command "fedtail sweep benchmarks/fedrema/$sweep.toml" "$@"
}
report table2_fmnist TABLE2 "FedReMa's Table 2 and Fig. 4 on Fashion-MNIST: s = 0.2 to 0.8, 100 samples per client" \
  --reference benchmarks/fedrema/paper_table2_cifar10.toml
report fig1_fmnist FIG1 \
  "FedReMa's Fig. 1 on Fashion-MNIST: accuracy against samples per client (500 rounds up to 400 samples, 200 at 600)"
report fig3_fmnist FIG3 "FedReMa's Fig. 3 on Fashion-MNIST: the similarity matrix S(t) under FedAvg and FedReMa"
report table4_validation_fmnist TABLE4_VALIDATION \
  "FedReMa's Table 4 on Fashion-MNIST: the variants' alignment weight on validation data"
report table4_fmnist TABLE4 "FedReMa's Table 4 on Fashion-MNIST: FedReMa, FedPAC, FedReMa+F, FedReMa+A&F, accuracy and runtime" \
  --reference benchmarks/fedrema/paper_table4_cifar10.toml
