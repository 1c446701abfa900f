"""CReFF's federated features on segmentation: their scale against the real per-pixel features, by
matching lr, and whether the re-trained classifier still predicts the background.

Made for issue 67: CReFF's matching lr (100) was chosen on 3136-d cnn-fmnist features; seg-tiny's
per-pixel features are 64-d. For the first rounds of ``table3_fmnist_seg.toml``'s CReFF run
(setting b1-if10, seed 0) at each matching lr, after every round: the L2 norm of the real per-pixel
features of the round's clients (the trained global body, each client's training pixels in its own
labelling), the mean norm of each class's federated features, the re-trained classifier's biases,
and on the clients' training canvases the share of pixels the global model (FedAvg's body with the
re-trained classifier) predicts as background against the share that is background. Training
data only: the run's evaluations are not reported.

Run:  python benchmarks/mupfl/seg_feature_scale.py [--rounds 3] [--lrs 0.1 1 10 100] [--out FILE.json]
(about 15 s a round on one core of the 2-core machine)
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import torch

from fedtail.engine import prepare
from fedtail.engine.callbacks import Callback
from fedtail.engine.executors import client_views
from fedtail.engine.simulation import Simulation
from fedtail.machine import describe, machine_info
from fedtail.provenance import code_info
from fedtail.sweep.spec import load_sweep

SWEEP = Path(__file__).with_name("table3_fmnist_seg.toml")


class Measure(Callback):
    """After each round: the federated features, the classifier and the background predictions."""

    def __init__(self, dataset, partition) -> None:
        self.dataset, self.views, self.rows = dataset, client_views(partition, dataset, "test"), []

    def on_round_end(self, sim, rnd, row) -> None:
        server, data = sim.server, self.dataset
        last = ((row or {}).get("rounds_log") or sim.round_logs)[-1]  # an evaluation row takes the logs
        model = sim.server_ctx.model()
        model.load_state_dict(server.global_weights())
        model.eval()
        per_class = server.features.features.view(server.features.num_classes, server.features.per_class, -1)
        real, predicted_bg, true_bg, pixels = [], 0, 0, 0
        background = data.num_classes - 1
        with torch.inference_mode():
            for cid in last["clients"]:
                view = self.views[cid]
                x, y = data.batch(data.train, view.train[:256], view.labels)
                real.append(model.features(x).movedim(1, -1).reshape(-1, model.classifier.in_features).norm(dim=-1))
                out = model(x).argmax(1)
                valid = y >= 0
                predicted_bg += int((out[valid] == background).sum())
                true_bg += int((y[valid] == background).sum())
                pixels += int(valid.sum())
        real = torch.cat(real)
        self.rows.append({
            "round": rnd,
            "real_feature_norm_median": round(float(real.median()), 3),
            "federated_feature_norm_by_class": [round(float(v), 2) for v in per_class.norm(dim=-1).mean(1)],
            "classifier_bias": [round(float(v), 2) for v in server.retrained["bias"]],
            "classes_reported": last.get("creff_classes"),
            "background_share_predicted": round(predicted_bg / pixels, 4),
            "background_share_true": round(true_bg / pixels, 4),
        })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.1, 1.0, 10.0, 100.0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    (planned,) = [r for r in load_sweep(SWEEP).runs if (r.setting, r.method, r.seed) == ("b1-if10", "creff", 0)]
    result = {
        "command": "python benchmarks/mupfl/seg_feature_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": date.today().isoformat(), "code": code_info(), "sweep": str(SWEEP.name), "runs": [],
    }  # fmt: skip
    for lr in args.lrs:
        raw = planned.config.model_dump(mode="json")
        raw |= {"rounds": args.rounds, "eval_every": args.rounds, "checkpoint_every": 0, "workers": 1,
                "sample_masks": 0, "options": raw["options"] | {"match_lr": lr}}  # fmt: skip
        config = type(planned.config).model_validate(raw)
        torch.set_num_threads(config.threads)
        dataset, partition = prepare(config)
        measure = Measure(dataset, partition)
        Simulation(config, dataset, partition, callbacks=[measure]).run()
        result["runs"].append({"match_lr": lr, "rounds": measure.rows})
    result["machine"] = describe(machine_info()) + f", {torch.get_num_threads()} thread(s)"
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
