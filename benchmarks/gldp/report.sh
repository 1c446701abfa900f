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
# Tiny-ImageNet (issue 65): runs only where the data is present; the cells show "—" until then.
.venv/bin/fedtail report \
  --sweep benchmarks/gldp/tinyimagenet.toml \
  --reference benchmarks/gldp/paper_tinyimagenet.toml \
  --out benchmarks/gldp/TINYIMAGENET.md \
  --title "GLDP (STHFL) and baselines on Tiny-ImageNet: Tables 1-3 (runs where the data is present)" \
  --command "fedtail sweep benchmarks/gldp/tinyimagenet.toml"
# CIFAR-100 (issue 65): the 20- and 30-class settings, runs only where the data is present.
.venv/bin/fedtail report \
  --sweep benchmarks/gldp/cifar100.toml \
  --reference benchmarks/gldp/paper_cifar100.toml \
  --out benchmarks/gldp/CIFAR100.md \
  --title "GLDP (STHFL) and baselines on CIFAR-100: Tables 1-3, 20 and 30 classes per client (runs where the data is present)" \
  --command "fedtail sweep benchmarks/gldp/cifar100.toml"
