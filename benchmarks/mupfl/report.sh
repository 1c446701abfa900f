#!/usr/bin/env bash
# Regenerates benchmarks/mupfl/RESULTS.md and its plots from the run folders (one section per table),
# and the documents of the probes and validation sweeps.
set -euo pipefail
cd "$(dirname "$0")/../.."
# report OUT-STEM TITLE SWEEP-STEM... [-- OPTION...]: benchmarks/mupfl/OUT-STEM.md from the named
# sweep files of benchmarks/mupfl/, with any further `fedtail report` options after the "--".
report() {
  local out=$1 title=$2 args=()
  shift 2
  while (($#)) && [[ $1 != -- ]]; do args+=(--sweep "benchmarks/mupfl/$1.toml"); shift; done
  (($#)) && shift
  .venv/bin/fedtail report "${args[@]}" --out "benchmarks/mupfl/$out.md" --title "$title" "$@"
}
TABLES=(--reference benchmarks/mupfl/paper_fmnist.toml --rounds-to 80 --rounds-to 90 --clients-to 90:15,20,25)
report RESULTS "MuPFL on Fashion-MNIST: Tables I, II, V and VI" table2_fmnist table5_fmnist table6_fmnist table1_fmnist \
  -- "${TABLES[@]}" --command "bash benchmarks/mupfl/run_all.sh"
# The first Tables II, V and VI, at lr 0.005 decayed every 3 local epochs (a misreading of Sec. 4.1;
# issue 64): their runs were moved under runs/superseded/lr0.005/ when the rerun at lr 0.01 began.
report RESULTS_lr0.005 \
  "MuPFL on Fashion-MNIST: Tables II, V and VI at lr 0.005, decay every 3 local epochs (superseded, issue 64)" \
  -- benchmarks/mupfl/runs/superseded/lr0.005/fmnist "${TABLES[@]}" \
  --command "bash benchmarks/mupfl/run_all.sh, with table2/5/6_fmnist.toml at lr 0.005 (their git history before b9684191)"
# The validation sweeps that chose the open hyperparameters (held-out training samples, not test data).
report VALIDATION "MuPFL on Fashion-MNIST: validation runs for the open hyperparameters" validation_fmnist \
  -- --command "bash benchmarks/mupfl/run_all.sh"
report VALIDATION2 \
  "MuPFL on Fashion-MNIST: validation sweep 2 (readings, PKCF order, BAVD variants, baselines' options)" \
  validation2_fmnist validation2_mupfl_fmnist
# The learning-rate probe (issue 64), the validation at the paper's lr 0.01 it led to (beside the
# probe's runs it is centred on), and the decay's "epochs" read as rounds against local epochs.
report LR_PROBE "MuPFL on Fashion-MNIST: learning-rate probe (issue 64)" lr_probe_fmnist \
  -- --command "fedtail sweep benchmarks/mupfl/lr_probe_fmnist.toml"
report LR001_VALIDATION "MuPFL on Fashion-MNIST: validation at lr 0.01 (issue 64)" \
  lr_probe_fmnist lr001_validation_fmnist
report DECAY_PROBE "MuPFL on Fashion-MNIST: learning-rate decay probe (issue 64)" decay_probe_fmnist
# BAVD per Eq. 6 at lr 0.01 (issue 64, item 2): every reading against BAVD off, validation data.
report BAVD_VALIDATION2 "MuPFL on Fashion-MNIST: BAVD per Eq. 6 (issue 64)" bavd_validation2_fmnist \
  -- --command "fedtail sweep benchmarks/mupfl/bavd_validation2_fmnist.toml --seeds 0 --jobs 1"
# Fig. 3(b): FedAvg's prediction probabilities of each class (issue 65).
report FIG3B "MuPFL's Fig. 3(b) on Fashion-MNIST: FedAvg's prediction probabilities of each class (issue 65)" \
  fig3b_fmnist -- --command "fedtail sweep benchmarks/mupfl/fig3b_fmnist.toml"
# Segmentation on fmnist-seg (issue 67): the validation of the methods' options, then Tables III and
# IV beside the paper's Cityscapes numbers (with Fig. 9's masks, which the Table III and IV runs sample).
report SEG_VALIDATION "MuPFL segmentation on fmnist-seg: validation (issue 67)" validation_seg_fmnist \
  -- --command "fedtail sweep benchmarks/mupfl/validation_seg_fmnist.toml"
report SEGMENTATION "MuPFL on fmnist-seg: Tables III and IV and Fig. 9 (segmentation, issue 67)" \
  table3_fmnist_seg table4_fmnist_seg -- --reference benchmarks/mupfl/paper_cityscapes.toml
