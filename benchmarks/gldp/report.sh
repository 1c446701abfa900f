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
# The data sets that cannot be downloaded here (issue 65): their sweeps run only where the data is
# present, and the cells show "—" until then. data_report SWEEP-STEM OUT-STEM TITLE writes OUT-STEM.md
# beside the paper's numbers in paper_SWEEP-STEM.toml.
data_report() {
  .venv/bin/fedtail report --sweep "benchmarks/gldp/$1.toml" --reference "benchmarks/gldp/paper_$1.toml" \
    --out "benchmarks/gldp/$2.md" --title "$3" --command "fedtail sweep benchmarks/gldp/$1.toml"
}
data_report tinyimagenet TINYIMAGENET \
  "GLDP (STHFL) and baselines on Tiny-ImageNet: Tables 1-3 (runs where the data is present)"
data_report cifar100 CIFAR100 \
  "GLDP (STHFL) and baselines on CIFAR-100: Tables 1-3, 20 and 30 classes per client (runs where the data is present)"
