"""Memory layout of CNN training steps: default (NCHW) against channels-last, per model.

Times one SGD step (batch 64, one intra-op thread) of every CNN in the registry, alternating
the two layouts so that load from other processes hits both alike. Prints one JSON line.

Run: python benchmarks/layout.py
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

from fedtail.models import build_model

MODELS = [("cnn-fmnist", (1, 28, 28)), ("cnn2fc", (1, 28, 28)), ("convnet", (3, 32, 32)), ("resnet8", (3, 32, 32))]


def step_ms(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps + 3):
        if i == 3:  # warm-up steps excluded
            start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    for name, shape in MODELS:
        x, y = torch.randn(64, *shape), torch.randint(0, 10, (64,))
        steps = 40 if name != "resnet8" else 6
        times: dict[str, list[float]] = {"default": [], "channels_last": []}
        for _ in range(3):
            for layout in times:
                torch.manual_seed(0)
                model = build_model(name, shape, 10)
                if layout == "channels_last":
                    model.to_channels_last()
                times[layout].append(step_ms(model, x, y, steps))
        best = {k: min(v) for k, v in times.items()}
        out[name] = {f"{k}_ms": round(v, 2) for k, v in best.items()} | {
            "speedup": round(best["default"] / best["channels_last"], 3)
        }
    print(json.dumps({"torch": torch.__version__, "threads": 1, "batch": 64, "best_of": 3, "models": out}))


if __name__ == "__main__":
    main()
