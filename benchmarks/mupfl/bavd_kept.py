"""How much BAVD keeps, step by step: the first rounds of a run folder's configuration again, with
every BAVD layer's kept fraction, active fraction and largest activation recorded at each step.

Made for issue 64: the BAVD reading chosen at lr 0.005 (mask from the current batch, rescaled by
the kept fraction) diverged in round 2 at the paper's lr 0.01 on both seeds
(``runs/bavd_validation2/a0.5-if10/mupfl-bavd-batch``). This script shows where: per round, the
steps' kept fraction (positions the mask keeps), active fraction (positive activations before
the mask), the rescaling factor (1 / kept fraction when ``bavd_rescale``) and the largest
activation before and after the mask. Training data only; nothing is evaluated.

Run:  python benchmarks/mupfl/bavd_kept.py RUN_FOLDER [--rounds 2] [--out FILE.json]
(the run's config.json; on one core of the 2-core machine about 90 s per round of the Table II
protocol)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import date
from pathlib import Path

import torch

from fedtail.algorithms.mupfl import bavd
from fedtail.config import RunConfig
from fedtail.engine import prepare
from fedtail.engine.callbacks import Callback
from fedtail.engine.simulation import Simulation
from fedtail.errors import RunDiverged
from fedtail.machine import describe, machine_info
from fedtail.provenance import code_info

STEPS: list[tuple[float, float, float, float]] = []  # (kept, active, max before, max after) per BAVD step


def _recording(original):
    """``ActivationMaps._hook`` wrapped: the same hook, its input and output measured in training."""

    def make(self, k):
        hook = original(self, k)

        def measured(module, inputs, output):
            result = hook(module, inputs, output)
            if module.training and result is not None:
                with torch.no_grad():
                    STEPS.append((float((result != 0).float().mean()), float((output > 0).float().mean()),
                                  float(output.abs().max()), float(result.abs().max())))  # fmt: skip
            return result

        return measured

    return make


class RoundMarks(Callback):
    """The index in STEPS where each round ends."""

    def __init__(self) -> None:
        self.ends: list[int] = []

    def on_round_end(self, sim, rnd, row) -> None:
        self.ends.append(len(STEPS))


def summarise(steps: list[tuple[float, float, float, float]], rescale: bool) -> dict:
    kept = torch.tensor([s[0] for s in steps], dtype=torch.float64)
    finite = [s for s in steps if math.isfinite(s[2]) and math.isfinite(s[3])]

    def q(values: torch.Tensor) -> list[float]:
        return [round(float(v), 4) for v in values.quantile(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))]

    out = {"steps": len(steps), "kept_fraction_min_median_max": q(kept),
           "active_fraction_min_median_max": q(torch.tensor([s[1] for s in steps], dtype=torch.float64)),
           "steps_with_non_finite_activations": len(steps) - len(finite)}  # fmt: skip
    if finite:
        out["largest_activation_before_mask"] = float(f"{max(s[2] for s in finite):.4g}")
        out["largest_activation_after_mask"] = float(f"{max(s[3] for s in finite):.4g}")
    if rescale:
        out["largest_rescaling_factor"] = round(1 / max(float(kept.min()), 1e-12), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (its config.json)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    source = args.run / "config.json"
    if not source.is_file():
        print(f"error: {source} does not exist", file=sys.stderr)
        return 2
    raw = json.loads(source.read_text())
    if raw.get("algorithm") != "mupfl" or not raw.get("options", {}).get("bavd"):
        print(f"error: {args.run} is not a MuPFL run with BAVD on", file=sys.stderr)
        return 2
    config = RunConfig.model_validate(raw | {"rounds": args.rounds, "checkpoint_every": 0, "eval_every": args.rounds, "workers": 1})
    torch.set_num_threads(config.threads)
    bavd.ActivationMaps._hook = _recording(bavd.ActivationMaps._hook)
    dataset, partition = prepare(config)
    marks = RoundMarks()
    status = "finished"
    try:
        Simulation(config, dataset, partition, callbacks=[marks]).run()
    except RunDiverged as err:  # a diverged run: what it recorded up to there is the point
        status = f"diverged: {err}"
    ends = marks.ends + ([len(STEPS)] if not marks.ends or marks.ends[-1] < len(STEPS) else [])
    rescale = bool(config.options.get("bavd_rescale", True))
    rounds, begin = [], 0
    for rnd, end in enumerate(ends, start=1):
        if end > begin:
            rounds.append({"round": rnd} | summarise(STEPS[begin:end], rescale))
        begin = end
    result = {
        "command": "python benchmarks/mupfl/bavd_kept.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": date.today().isoformat(),
        "machine": describe(machine_info()) + f", {torch.get_num_threads()} thread(s)",
        "code": code_info(), "run": str(args.run), "status": status, "rounds": rounds,
    }  # fmt: skip
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
