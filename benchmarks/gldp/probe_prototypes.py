"""Why is GLDP weak on Fashion-MNIST stage tasks? A diagnostic of one run's final models.

Runs one GLDP configuration in this process (the flags of `fedtail run`, as key=value pairs for
`--set`-style overrides of the base below), then scores every client's final model on its
seen-stage test data with five prediction rules among the classes it holds:

- gp / lp / head: the run's own named accuracies (global prototypes, local prototypes, classifier);
- fresh-lp: nearest prototype where the client's prototypes are recomputed with its final model on
  all its seen stages' training data (an oracle that replays old data: what lp would be without
  stale prototypes);
- fresh-gp: the uniform mean over holders of every client's fresh prototypes (the same for gp).

and prints them with the per-stage breakdown of the last row and the global model's accuracy.
If fresh-* is far above gp / lp, stale prototypes (computed with an earlier body) explain the
gap; if not, the shared representation itself is the limit.

    PYTHONPATH=src python benchmarks/gldp/probe_prototypes.py stage_schedule=blocks rounds_per_stage=4
    PYTHONPATH=src python benchmarks/gldp/probe_prototypes.py          # nested (the default)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from fedtail.algorithms.gldp import embed, held_classes, representation_statistics
from fedtail.algorithms.prototypes import nearest_prototype_scores
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.context import ClientContext, load_weights
from fedtail.engine.executors import ClientRuntime
from fedtail.engine.simulation import Simulation
from fedtail.engine.training import evaluate

# The colleague's setting (fmnist stages, 20 clients, 2 classes per stage, 5 stages, IF 10, 20 rounds).
BASE = {
    "algorithm": "gldp", "dataset": "fmnist", "model": "cnn-fmnist", "fraction": 0.5, "rounds": 20,
    "checkpoint_every": 0,
    "partition": {"scheme": "stages", "num_clients": 20, "classes_per_stage": 2, "stages": 5, "imbalance": 10},
    "train": {"batch_size": 32, "lr": 0.01},
}  # fmt: skip


def load_client(model, sim: Simulation, cid: int) -> None:
    """The shared layers and client ``cid``'s classifier (the initial one if it never trained)."""
    state = sim.client_state.get(cid, {})
    initial = {k: sim.server_ctx.init_weights[k] for k in model.classifier_keys()}
    load_weights(model, sim.server.shared | state.get("classifier", initial))


def main(argv: list[str]) -> None:
    config = build_config(BASE, argv)
    start = time.perf_counter()
    dataset, partition = prepare(config)
    sim = Simulation(config, dataset, partition)
    summary = sim.run()
    row = sim.record.rows[-1]
    rt = ClientRuntime(config, dataset, partition)
    views = rt.views.at(config.rounds)
    seen = config.plan.seen_stages(config.rounds)
    C = dataset.num_classes
    model = rt.workspace.model("probe")
    fresh, fresh_present = [], []
    for cid, client in enumerate(partition.clients):
        load_client(model, sim, cid)
        index = torch.as_tensor(np.concatenate([st.train for st in client.stages[:seen]]), dtype=torch.int64)
        stats = representation_statistics(model, dataset, index)
        fresh.append(stats.means)
        fresh_present.append(stats.present)
    holders = torch.stack(fresh_present).sum(0)
    fresh_global = torch.stack([m * p.unsqueeze(1) for m, p in zip(fresh, fresh_present)]).sum(0)
    fresh_global = fresh_global / holders.clamp(min=1).unsqueeze(1)
    acc = {"fresh-lp": [], "fresh-gp": []}
    for cid in range(len(partition.clients)):
        load_client(model, sim, cid)
        ctx = ClientContext(cid, config.rounds, 0, views[cid], rt.workspace, rt.options, sim.client_state.get(cid, {}))
        held = held_classes(ctx)
        view = views[cid]
        for name, protos, present in (("fresh-lp", fresh[cid], fresh_present[cid]),
                                      ("fresh-gp", fresh_global, holders > 0)):  # fmt: skip
            usable = present & held
            counts = evaluate(model, dataset, view.eval_split, view.eval_index, C,
                              predict=lambda x: nearest_prototype_scores(embed(model, x), protos, usable))  # fmt: skip
            acc[name].append(counts.accuracy)
    out = {
        "config": {"stage_schedule": config.plan.schedule, "options": config.options, "rounds": config.rounds},
        "final_round": row["round"],
        "global_acc": row["global_acc"],
        "a_global": row["a_global"],
        **{name: {"a_local": v["a_local"], "by_stage": v["a_local_by_stage"]} for name, v in row["named"].items()},
        **{name: {"a_local": float(np.mean(v))} for name, v in acc.items()},
        "seconds": round(time.perf_counter() - start, 1),
        "run_seconds": round(summary["wall_time_s"], 1),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
