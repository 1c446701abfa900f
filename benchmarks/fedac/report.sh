#!/usr/bin/env bash
# Regenerates benchmarks/fedac/RESULTS.md (Table 1, the paper's CIFAR-10 numbers beside it as the
# ordering to compare; Figure 4's mu / lambda curves and the CNT figure from the 1000-round
# validation runs, on validation data), PROBE.md, VALIDATION.md and VALIDATION1000.md (and their plots) from the run folders.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report \
  --sweep benchmarks/fedac/table1_fmnist.toml \
  --sweep benchmarks/fedac/table1_path3_k10_fmnist.toml \
  --sweep benchmarks/fedac/validation1000_fmnist.toml \
  --reference benchmarks/fedac/paper_cifar10.toml \
  --out benchmarks/fedac/RESULTS.md \
  --title "FedAC and its Table 1 baselines on Fashion-MNIST" \
  --command "fedtail sweep benchmarks/fedac/table1_fmnist.toml"
# one sweep file's own report: report FILE-STEM OUT-STEM TITLE
report() {
  .venv/bin/fedtail report --sweep "benchmarks/fedac/$1.toml" --out "benchmarks/fedac/$2.md" \
    --title "$3" --command "fedtail sweep benchmarks/fedac/$1.toml"
}
report probe_fmnist PROBE "FedAC and baselines on Fashion-MNIST: 30-round cost probe"
report lam_validation_fmnist LAM_VALIDATION "FedAC on Fashion-MNIST: lambda past the old grid, on validation data (issue 64)"
report path3_validation_fmnist PATH3_VALIDATION \
  "FedAC on Fashion-MNIST, 3 classes per client: fixed-K mu grid on validation data (issue 64)"
report validation_fmnist VALIDATION "FedAC and baselines on Fashion-MNIST: validation runs for the open hyperparameters"
report validation1000_fmnist VALIDATION1000 "FedAC and baselines on Fashion-MNIST: validation at the full 1000-round budget"
report fig2_fmnist FIG2 "FedAC's Fig. 2 on Fashion-MNIST: client similarity of data and models (issue 65)"
report fig3cd_fmnist FIG3CD "FedAC's Fig. 3(c), 3(d) on Fashion-MNIST: LrCos against L2 as the similarity (issue 65)"
report fig4c_fmnist FIG4C "FedAC's Fig. 4(c) on Fashion-MNIST: G_c against a preset K, cluster-number tuning off (issue 65)"
