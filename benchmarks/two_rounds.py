"""Every algorithm for 2 rounds on Fashion-MNIST: final metrics and a digest of everything a run computed.

    python benchmarks/two_rounds.py --device cpu --out a.json        # run every packaged algorithm
    python benchmarks/two_rounds.py --compare a.json b.json          # bit-identical? (exit 1 if not)
    python benchmarks/two_rounds.py --compare cpu.json gpu.json --tolerance

What it is for:
- **The CPU stays bit-identical across code changes.** Run it before and after a change on one
  machine (one instruction set: AVX2 and AVX-512 round differently) and ``--compare``: the digests
  cover every metrics row (timings left out), the server's and the edges' state and every client's
  state after the last round, bit for bit.
- **CPU against GPU** (``benchmarks/gpu.py``, part b): the same runs on both devices, the final
  metrics side by side, with the largest differences after the first evaluated round (relative,
  of the training losses; absolute, of the accuracies; :data:`TOLERANCE`) and at the end.

The protocol is small and fixed: 10 Dirichlet (α 0.5, imbalance 10) clients of ``cnn-fmnist``, half
of them a round, 1 local epoch of batch 64 at lr 0.01, every option at its default except the few
that make a method act within 2 rounds (``SPECIAL``) or cost minutes (``CHEAP``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

# Options a method needs to act within 2 tiny rounds (server data, a stage task, an early
# clustering round), and what keeps its server work to seconds.
SPECIAL: dict[str, dict[str, Any]] = {
    "fedic": {"partition": {"server_samples_per_class": 10, "server_unlabelled": 200},
              "options": {"distill_steps": 10, "finetune_steps": 10, "gate_steps": 10}},
    "gldp": {"partition": {"scheme": "stages", "stages": 2, "classes_per_stage": 3}},
    "fedgroup": {"options": {"num_groups": 2, "pretrain_clients": 3}},
    "flhc": {"options": {"cluster_round": 1, "num_clusters": 2}},
    "mupfl": {"edges": 2},
    "fedac": {"options": {"pca_every": 1}},
}
CHEAP: dict[str, dict[str, Any]] = {
    "creff": {"options": {"retrain_epochs": 20}},
    "mupfl": {"options": {"num_features": 100}},
    "fedbabu": {"finetune": {"epochs": 1}},
}


# Runs beside the algorithms' own: NAME@VARIANT -> (algorithm, settings). A BatchNorm ResNet (global
# average pooling, batch statistics; a few steps, it is slow on a CPU).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg@resnet8": ("fedavg", {"model": "resnet8", "train": {"local_steps": 5}}),
    # fine-tuning before evaluation (RunConfig.finetune): the head alone; plain steps at α whatever
    # the run's momentum and clipping
    "fedbabu@head": ("fedbabu", {"finetune": {"params": "head"}}),
    "perfedavg@alpha": ("perfedavg", {"options": {"alpha": 0.05}, "train": {"momentum": 0.9, "grad_clip": 1.0}}),
}


def algorithms() -> list[str]:
    """Every packaged algorithm, then the variants."""
    from fedtail.algorithms import ALGORITHMS

    return sorted(n for n, spec in ALGORITHMS.items() if spec.server.__module__.startswith("fedtail.")) + list(VARIANTS)


def raw_config(name: str, **top: Any) -> dict[str, Any]:
    """The run ``name`` (an algorithm or a variant; a raw config dict, as a TOML file would give it)."""
    name, variant = VARIANTS.get(name, (name, {}))
    top = variant | top
    raw: dict[str, Any] = {
        "algorithm": name,
        "dataset": "fmnist",
        "model": "cnn-fmnist",
        "partition": {"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5, "imbalance": 10.0},
        "train": {"local_epochs": 1, "batch_size": 64, "lr": 0.01},
        "fraction": 0.5,
        "rounds": 2,
        "seed": 0,
        "checkpoint_every": 0,
    }
    for extra in (SPECIAL.get(name, {}), CHEAP.get(name, {}), top):
        for key, value in extra.items():
            raw[key] = (raw.get(key) or {}) | value if isinstance(value, dict) else value
    if raw["partition"].get("scheme") == "stages":
        raw["partition"] = {k: v for k, v in raw["partition"].items() if k != "alpha"}
    return raw


def _option_ok(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without the CHEAP options this version's algorithm does not have."""
    from fedtail.components import algorithm

    fields = algorithm(name).config.model_fields
    options = {k: v for k, v in raw.get("options", {}).items() if k in fields}
    return raw | {"options": options}


def _digest(value: Any, h: "hashlib._Hash") -> None:
    """Feed ``value`` (plain containers of tensors, arrays, numbers) into ``h``, bit for bit."""
    import numpy as np

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        buf = io.BytesIO()
        buf.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        h.update(buf.getvalue())
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _digest(value[k], h)
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _digest(v, h)
        h.update(b"]")
    elif isinstance(value, float):
        h.update(b"nan" if math.isnan(value) else value.hex().encode())
    else:
        h.update(repr(value).encode())


def _timeless(value: Any) -> Any:
    """``value`` without wall-clock entries (keys ending in ``_s``)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not str(k).endswith("_s")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def run_one(name: str, device: str | None = None, **top: Any) -> dict[str, Any]:
    """One algorithm's 2 rounds: its final metrics, the metric rows, and digests of rows and states."""
    from fedtail.components import build_config
    from fedtail.engine import checkpoint, prepare
    from fedtail.engine.callbacks import Rows
    from fedtail.engine.simulation import Simulation

    extra = {} if device is None else {"device": device}
    raw = raw_config(name, **top, **extra)
    config = build_config(_option_ok(raw["algorithm"], raw))
    dataset, partition = prepare(config)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    sim = Simulation(config, dataset, partition, callbacks=[Rows(rows)])
    sim.run()
    seconds = time.perf_counter() - start
    digests = {}
    for part, value in (
        ("rows", _timeless(rows)),
        ("server", checkpoint.encode(sim.server.state_dict())),
        ("edge", checkpoint.encode(sim.edge.state_dict())),
        ("clients", {cid: checkpoint.encode(s) for cid, s in sim.client_state.items()}),
    ):
        h = hashlib.sha256()
        _digest(value, h)
        digests[part] = h.hexdigest()[:16]
    return {"seconds": round(seconds, 2), "digest": digests, "rows": _timeless(rows)}


def _numbers(value: Any, path: str = "") -> dict[str, float]:
    """Every number of a row, by path (``named.gp.personalized_acc``, ``per_client_acc[3]``)."""
    if isinstance(value, bool) or value is None:
        return {}
    if isinstance(value, (int, float)):
        return {path: float(value)}
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "rounds_log":
                out |= _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out |= _numbers(v, f"{path}[{i}]")
    return out


def _largest(na: dict[str, float], nb: dict[str, float], keys) -> tuple[float, str]:
    worst, where = 0.0, ""
    for key in keys:
        x, y = na[key], nb[key]
        if math.isnan(x) and math.isnan(y):
            continue
        d = abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf
        if d > worst:
            worst, where = d, key
    return worst, where


def differences(a: list[dict], b: list[dict], index: int) -> dict[str, Any]:
    """How two runs' metrics rows ``a[index]``, ``b[index]`` differ: the largest absolute difference
    of a mean accuracy (personalised or global, named ones included: ``acc``, and which: ``acc_at``)
    and the largest relative difference of a training loss (``loss``)."""
    na, nb = _numbers(a[index]), _numbers(b[index])
    keys = na.keys() & nb.keys()
    acc, at = _largest(na, nb, [k for k in keys if k.endswith(("personalized_acc", "global_acc"))])
    loss = 0.0
    for key in (k for k in keys if "loss" in k):
        x, y = na[key], nb[key]
        if math.isfinite(x) and math.isfinite(y) and max(abs(x), abs(y)) > 0:
            loss = max(loss, abs(x - y) / max(abs(x), abs(y)))
    return {"acc": acc, "acc_at": at, "loss": loss}


# Agreement of two devices after the first evaluated round (benchmarks/gpu.py, part b): float32 on both,
# different kernels, so the weights differ in their last bits; a test sample near a decision boundary
# can then flip, which moves a client's accuracy by 1 / (its test samples) and the mean over the
# 10 clients of this protocol by a tenth of that (196 to 1,066 test samples a client: 0.0005 to
# 0.0001 a sample). 0.01 (one point) allows a few such flips on every client, not a systematic gap.
TOLERANCE = {"loss": 1e-4, "acc": 0.01}


def compare(a: dict[str, Any], b: dict[str, Any], tolerance: dict[str, float] | None) -> int:
    """Print the runs side by side; 0 when every algorithm agrees (bit for bit, or after the first
    evaluated round within ``tolerance``: relative training loss, absolute accuracy)."""
    bad = 0
    print(f"{'algorithm':12} {'acc A':>8} {'acc B':>8} {'loss r1':>9} {'acc r1':>8} {'acc end':>8}  verdict")
    for name in sorted(a["runs"].keys() | b["runs"].keys()):
        ra, rb = a["runs"].get(name), b["runs"].get(name)
        if ra is None or rb is None or "error" in ra or "error" in rb:
            print(f"{name:12} missing or failed: {(ra or {}).get('error') or (rb or {}).get('error') or 'absent'}")
            bad += 1
            continue
        first, last = differences(ra["rows"], rb["rows"], 0), differences(ra["rows"], rb["rows"], -1)
        identical = ra["digest"] == rb["digest"]
        within = tolerance is not None and first["loss"] <= tolerance["loss"] and first["acc"] <= tolerance["acc"]
        ok = identical or within
        verdict = "identical" if identical else "differs in " + ", ".join(
            k for k in ra["digest"] if ra["digest"][k] != rb["digest"][k])
        if tolerance is not None and not identical:
            verdict += "; round 1 " + ("within" if within else "beyond") + " the tolerance"
        acc = lambda r: r["rows"][-1].get("personalized_acc")  # noqa: E731
        print(f"{name:12} {acc(ra):8.4f} {acc(rb):8.4f} {first['loss']:9.2g} {first['acc']:8.4f} {last['acc']:8.4f}  {verdict}")
        bad += not ok
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="the runs' --device (default: the run setting's default)")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    parser.add_argument("--algorithms", default="", help="comma-separated subset (default: every packaged one)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--tolerance", action="store_true",
                        help="with --compare: agreement after the first evaluated round within TOLERANCE, not bit for bit")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        return compare(a, b, TOLERANCE if args.tolerance else None)
    from fedtail.machine import machine_info
    from fedtail.provenance import code_info

    names = [n for n in args.algorithms.split(",") if n] or algorithms()
    result: dict[str, Any] = {"machine": machine_info(), "code": code_info(), "device": args.device, "runs": {}}
    for name in names:
        try:
            result["runs"][name] = run_one(name, args.device)
        except Exception as err:  # noqa: BLE001 - one broken algorithm must not hide the others
            result["runs"][name] = {"error": f"{type(err).__name__}: {err}"}
        r = result["runs"][name]
        print(f"{name:12} " + (f"{r['seconds']:7.1f} s  acc {r['rows'][-1]['personalized_acc']:.4f}  {r['digest']}"
                                if "error" not in r else r["error"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 1 if any("error" in r for r in result["runs"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
