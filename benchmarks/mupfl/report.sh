#!/usr/bin/env bash
# Regenerates benchmarks/mupfl/RESULTS.md and its plots from the run folders (one section per table).
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/table2_fmnist.toml \
  --sweep benchmarks/mupfl/table5_fmnist.toml \
  --sweep benchmarks/mupfl/table6_fmnist.toml \
  --out benchmarks/mupfl/RESULTS.md \
  --reference benchmarks/mupfl/paper_fmnist.toml \
  --rounds-to 80 --rounds-to 90 --clients-to 90:15,20,25 \
  --title "MuPFL on Fashion-MNIST: Tables II, V and VI" \
  --command "bash benchmarks/mupfl/run_all.sh"
# The first Tables II, V and VI, at lr 0.005 decayed every 3 local epochs (a misreading of Sec. 4.1;
# issue 64): their runs were moved under runs/superseded/lr0.005/ when the rerun at lr 0.01 began.
.venv/bin/fedtail report benchmarks/mupfl/runs/superseded/lr0.005/fmnist \
  --out benchmarks/mupfl/RESULTS_lr0.005.md \
  --reference benchmarks/mupfl/paper_fmnist.toml \
  --rounds-to 80 --rounds-to 90 --clients-to 90:15,20,25 \
  --title "MuPFL on Fashion-MNIST: Tables II, V and VI at lr 0.005, decay every 3 local epochs (superseded, issue 64)" \
  --command "bash benchmarks/mupfl/run_all.sh, with table2/5/6_fmnist.toml at lr 0.005 (their git history before b9684191)"
# The validation sweep that chose the open hyperparameters (held-out training samples, not test data).
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/validation_fmnist.toml \
  --out benchmarks/mupfl/VALIDATION.md \
  --title "MuPFL on Fashion-MNIST: validation runs for the open hyperparameters" \
  --command "bash benchmarks/mupfl/run_all.sh"
# Validation sweep 2: both stages in one document.
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/validation2_fmnist.toml \
  --sweep benchmarks/mupfl/validation2_mupfl_fmnist.toml \
  --out benchmarks/mupfl/VALIDATION2.md \
  --title "MuPFL on Fashion-MNIST: validation sweep 2 (readings, PKCF order, BAVD variants, baselines' options)"
# The learning-rate probe (issue 64) and the validation at the paper's lr 0.01 it led to.
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/lr_probe_fmnist.toml \
  --out benchmarks/mupfl/LR_PROBE.md \
  --title "MuPFL on Fashion-MNIST: learning-rate probe (issue 64)" \
  --command "fedtail sweep benchmarks/mupfl/lr_probe_fmnist.toml"
# Fig. 3(b): FedAvg's prediction probabilities of each class (issue 65).
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/fig3b_fmnist.toml \
  --out benchmarks/mupfl/FIG3B.md \
  --title "MuPFL's Fig. 3(b) on Fashion-MNIST: FedAvg's prediction probabilities of each class (issue 65)" \
  --command "fedtail sweep benchmarks/mupfl/fig3b_fmnist.toml"
# BAVD per Eq. 6 at lr 0.01 (issue 64, item 2): every reading against BAVD off, validation data.
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/bavd_validation2_fmnist.toml \
  --out benchmarks/mupfl/BAVD_VALIDATION2.md \
  --title "MuPFL on Fashion-MNIST: BAVD per Eq. 6 (issue 64)" \
  --command "fedtail sweep benchmarks/mupfl/bavd_validation2_fmnist.toml --seeds 0 --jobs 1"
# The validation at lr 0.01 (issue 64, item 1), beside the lr probe's runs it is centred on.
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/lr_probe_fmnist.toml \
  --sweep benchmarks/mupfl/lr001_validation_fmnist.toml \
  --out benchmarks/mupfl/LR001_VALIDATION.md \
  --title "MuPFL on Fashion-MNIST: validation at lr 0.01 (issue 64)"
# The decay's "epochs" read as rounds against local epochs (issue 64, item 1).
.venv/bin/fedtail report \
  --sweep benchmarks/mupfl/decay_probe_fmnist.toml \
  --out benchmarks/mupfl/DECAY_PROBE.md \
  --title "MuPFL on Fashion-MNIST: learning-rate decay probe (issue 64)"
