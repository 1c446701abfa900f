"""fedtail on a GPU: engine throughput, every algorithm against the CPU, the papers' protocols per round.

    python benchmarks/gpu.py --out gpu.json --markdown gpu.md     # on a GPU machine (also `make bench-gpu`)
    python benchmarks/gpu.py --device cpu --quick --out q.json    # the script itself on a CPU, in a minute

One run measures everything (a, then c, then b, the longest), writing ``--out`` after each part
and each run in it (a run cut short keeps what it measured) and, at the end, ``--markdown``: the GPU
section of benchmarks/RESULTS.md.

a. **Throughput** (the protocol of ``benchmarks/throughput.py`` on the device: FedAvg on long-tailed
   Fashion-MNIST, 50 clients, 20 % a round, 2 local epochs, batch 64, ``cnn-fmnist``): a bare
   centralised loop with the same model, layout, batch and data on the device (before and after
   the FL runs; their mean is the reference), FL serial, FL serial without deterministic kernels
   (their cost), FL with 2, 4 and 8 worker processes on one GPU; samples/s and the efficiency
   against the bare loop. Serial, a repeated serial and every worker run must agree bit for bit
   (same seed, same GPU model). Host↔device copies of one round are counted by the profiler.
   Two ways of removing kernel-launch overhead are measured on the bare loop, as ceilings for an
   engine option: the training step captured as a CUDA graph, and ``torch.func.vmap`` over the
   steps of K clients at once.
b. **Every algorithm for 2 rounds** on the GPU and on the CPU (``benchmarks/two_rounds.py``; the CPU
   runs go in a process pool beside the GPU runs): final accuracies side by side and the largest
   differences after the first evaluated round (``two_rounds.TOLERANCE``).
c. **The papers' protocols**: FedReMa's Table 1 (``fedrema``, seed 0), MuPFL's Table II
   (``mupfl``, α 0.5, IF 10, seed 0) and its segmentation Table III on fmnist-seg (``mupfl``, β 1,
   IF 10, seed 0), their first 5 rounds on the device, serial and with 4
   workers; seconds per round over rounds 2-5 (evaluations as the protocol schedules them), against
   the committed 2-core CPU runs of the same configuration (their wall time per round, and the
   instruction set they ran on).

Targets (issue 63, shown here, never by tests): FL serial ≥ 0.9 of the bare loop; W workers ≥ 2.5×
one worker; FedReMa's protocol ≥ 20× faster per round than on the 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import two_rounds  # noqa: E402  (benchmarks/two_rounds.py)

from fedtail.components import build_config  # noqa: E402
from fedtail.config import RunConfig  # noqa: E402
from fedtail.engine import prepare  # noqa: E402
from fedtail.engine.callbacks import Rows  # noqa: E402
from fedtail.engine.device import configure, resolve  # noqa: E402
from fedtail.engine.simulation import Simulation  # noqa: E402
from fedtail.machine import machine_info  # noqa: E402
from fedtail.models import build_model  # noqa: E402
from fedtail.provenance import code_info  # noqa: E402

PROTOCOLS = {  # part c: (sweep file, setting, method, the committed 2-core run of seed 0)
    "FedReMa Table 1": ("fedrema/table1_fmnist.toml", "s0.2", "fedrema", "fedrema/runs/fmnist/s0.2/fedrema/seed0"),
    # the lr 0.005 run (issue 64's rerun at 0.01 is under way): the lr leaves the seconds per round alike
    "MuPFL Table II": ("mupfl/table2_fmnist.toml", "a0.5-if10", "mupfl", "mupfl/runs/superseded/lr0.005/fmnist/a0.5-if10/mupfl/seed0"),
    # segmentation (issue 67): per-pixel training, confusion-matrix evaluation and per-pixel PKCF on the device
    "MuPFL Table III (fmnist-seg)": ("mupfl/table3_fmnist_seg.toml", "b1-if10", "mupfl", "mupfl/runs/seg/b1-if10/mupfl/seed0"),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- a. throughput --------------------------------------------------------------------------------------


def fl_config(args: argparse.Namespace, **top: Any) -> RunConfig:
    return build_config({
        "algorithm": "fedavg", "dataset": "fmnist", "model": "cnn-fmnist",
        "partition": {"scheme": "dirichlet", "alpha": 0.5, "imbalance": 10, "num_clients": args.clients},
        "train": {"local_epochs": args.local_epochs, "batch_size": args.batch_size, "lr": 0.005},
        "fraction": 0.2, "rounds": args.rounds, "eval_every": 10_000, "seed": 0, "checkpoint_every": 0,
        "device": args.device,
    } | top)  # fmt: skip


def fl_run(config: RunConfig, dataset, partition) -> dict[str, Any]:
    """One FL run: samples/s of its rounds (training, messages, aggregation; not the final evaluation)."""
    rows: list[dict] = []
    start = time.perf_counter()
    sim = Simulation(config, dataset, partition, callbacks=[Rows(rows)])
    setup = time.perf_counter() - start
    summary = sim.run()
    train_time = summary["wall_time_s"] - summary["time_s"]["evaluation"]
    return {
        "workers": config.workers,
        "deterministic": config.deterministic,
        "samples": summary["samples_trained"],
        "train_time_s": round(train_time, 3),
        "setup_time_s": round(setup, 3),
        "samples_per_s": round(summary["samples_trained"] / train_time, 1),
        "final_personalized_acc": summary["final"]["personalized_acc"],
        "rows": two_rounds._timeless(rows),
    }


def _bare_model(dataset, device: torch.device):
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = build_model("cnn-fmnist", dataset.input_shape, dataset.num_classes)
    return model.to(device).to_channels_last()


def bare_run(dataset, index: torch.Tensor, samples: int, batch_size: int) -> float:
    """A plain centralised SGD loop with the engine's model, layout, batch size and on-device data: samples/s."""
    device = dataset.device
    model = _bare_model(dataset, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    g = torch.Generator().manual_seed(0)
    model.train()
    done = 0
    synchronize(device)
    start = time.perf_counter()
    while done < samples:
        order = index[torch.randperm(len(index), generator=g).to(device)]
        for batch in order.split(batch_size):
            x, y = dataset.batch(dataset.train, batch)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += len(batch)
            if done >= samples:
                break
    synchronize(device)
    return done / (time.perf_counter() - start)


def graphed_bare_run(dataset, index: torch.Tensor, samples: int, batch_size: int) -> float | None:
    """The bare loop with its training step captured once as a CUDA graph and replayed (full batches)."""
    device = dataset.device
    if device.type != "cuda":
        return None
    model = _bare_model(dataset, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.005)
    x0, y0 = dataset.batch(dataset.train, index[:batch_size])
    static_x, static_y = x0.clone(), y0.clone()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up outside the graph (PyTorch's whole-network capture recipe)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(static_x), static_y).backward()
        opt.step()
    g = torch.Generator().manual_seed(0)
    done = 0
    synchronize(device)
    start = time.perf_counter()
    while done < samples:
        order = index[torch.randperm(len(index), generator=g).to(device)]
        for batch in order.split(batch_size):
            if len(batch) < batch_size:
                continue
            x, y = dataset.batch(dataset.train, batch)
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            done += batch_size
            if done >= samples:
                break
    synchronize(device)
    return done / (time.perf_counter() - start)


def vmap_run(dataset, index: torch.Tensor, samples: int, batch_size: int, clients: int) -> float:
    """K clients' SGD steps at once with ``torch.func``: one vmapped gradient of K models on K batches."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    device = dataset.device
    with torch.device("cpu"):
        models = [build_model("cnn-fmnist", dataset.input_shape, dataset.num_classes) for _ in range(clients)]
    models = [m.to(device) for m in models]
    params, buffers = stack_module_state(models)
    base = models[0]

    def loss(p, b, x, y):
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    step = vmap(grad(loss))
    g = torch.Generator().manual_seed(0)
    done = 0
    synchronize(device)
    start = time.perf_counter()
    while done < samples:
        order = index[torch.randperm(len(index), generator=g).to(device)]
        usable = len(order) // (batch_size * clients) * batch_size * clients
        for chunk in order[:usable].split(batch_size * clients):
            x, y = dataset.batch(dataset.train, chunk)
            x, y = x.view(clients, batch_size, *x.shape[1:]), y.view(clients, batch_size)
            grads = step(params, buffers, x, y)
            with torch.no_grad():
                for name, p in params.items():
                    p.sub_(grads[name], alpha=0.005)
            done += len(chunk)
            if done >= samples:
                break
    synchronize(device)
    return done / (time.perf_counter() - start)


def count_transfers(config: RunConfig, dataset, partition) -> dict[str, Any]:
    """Host↔device copies and waits of one FedAvg round after a warm-up round (torch.profiler's CUDA
    activity; a host read of a device value is a device-to-host copy and a wait). Nothing on a CPU."""
    from torch.profiler import ProfilerActivity, profile

    sim = Simulation(config.model_copy(update={"rounds": 2, "workers": 1}), dataset, partition)
    sim.run_round(1)
    device = resolve(config.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        sim.run_round(2)
        synchronize(device)
    sim.executor.close()
    counts = {"htod": 0, "dtoh": 0, "syncs": 0}
    for event in prof.events():
        name = event.name
        if "Memcpy HtoD" in name:
            counts["htod"] += 1
        elif "Memcpy DtoH" in name:
            counts["dtoh"] += 1
        elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            counts["syncs"] += 1
    log = sim.round_logs[-1]
    batches = sum(-(-len(partition.clients[c].train) // config.train.batch_size) for c in log["clients"])
    return counts | {"clients": len(log["clients"]), "batches": batches * config.train.local_epochs}


def part_a(args: argparse.Namespace, out: dict[str, Any], save: Callable[[], None]) -> None:
    config = fl_config(args)
    dataset, partition = prepare(config)
    device = resolve(args.device)
    configure(device)
    data = dataset.to(device)
    index = torch.as_tensor(partition.kept, dtype=torch.int64, device=device)
    bare_run(data, index, 3 * args.batch_size, args.batch_size)  # one-off costs (lazy init, cuDNN) first
    a: dict[str, Any] = out.setdefault("a", {})
    sampled = config.clients_per_round
    expected = int(sum(len(c.train) for c in partition.clients) / args.clients * sampled * args.local_epochs * args.rounds)
    bare = [bare_run(data, index, expected, args.batch_size)]
    serial = fl_run(config, dataset, partition)
    again = fl_run(config, dataset, partition)
    free = fl_run(config.model_copy(update={"deterministic": False}), dataset, partition)
    bare.append(bare_run(data, index, serial["samples"], args.batch_size))
    a["bare_samples_per_s"] = [round(b, 1) for b in bare]
    a["serial"], a["nondeterministic"] = serial, free
    a["serial_repeat_identical"] = again["rows"] == serial["rows"]
    a["efficiency_serial"] = round(serial["samples_per_s"] / (sum(bare) / 2), 3)
    save()
    a["workers"] = {}
    for w in args.workers:
        run = fl_run(config.model_copy(update={"workers": w}), dataset, partition)
        run["identical_to_serial"] = run.pop("rows") == serial["rows"]
        run["speedup_over_serial"] = round(run["samples_per_s"] / serial["samples_per_s"], 3)
        a["workers"][str(w)] = run
        save()
    for r in (serial, free):
        r.pop("rows", None)
    a["transfers_per_round"] = count_transfers(config, dataset, partition)
    launch = {"graph_samples_per_s": graphed_bare_run(data, index, serial["samples"], args.batch_size)}
    for k in args.vmap:
        launch[f"vmap{k}_samples_per_s"] = round(vmap_run(data, index, serial["samples"], args.batch_size, k), 1)
    a["launch_overhead"] = launch
    save()


# --- b. every algorithm against the CPU ------------------------------------------------------------------


def _cpu_run(name: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    torch.set_num_threads(1)
    try:
        return name, two_rounds.run_one(name, "cpu", **extra)
    except Exception as err:  # noqa: BLE001 - one broken algorithm must not hide the others
        return name, {"error": f"{type(err).__name__}: {err}"}


def part_b(args: argparse.Namespace, out: dict[str, Any], save: Callable[[], None]) -> None:
    names = args.algorithms or two_rounds.algorithms()
    b: dict[str, Any] = out.setdefault("b", {"gpu": {}, "cpu": {}})
    jobs = max(1, min(len(names), (os.cpu_count() or 2) - 2))
    import multiprocessing as mp

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        cpu = [pool.submit(_cpu_run, name, args.b_extra) for name in names]
        for name in names:  # on the device meanwhile, one after another
            try:
                b["gpu"][name] = two_rounds.run_one(name, args.device, **args.b_extra)
            except Exception as err:  # noqa: BLE001
                b["gpu"][name] = {"error": f"{type(err).__name__}: {err}"}
            save()
        for future in cpu:
            name, result = future.result()
            b["cpu"][name] = result
    b["comparison"] = {}
    for name in names:
        g, c = b["gpu"][name], b["cpu"][name]
        if "error" in g or "error" in c:
            b["comparison"][name] = {"error": g.get("error") or c.get("error")}
            continue
        first, last = two_rounds.differences(c["rows"], g["rows"], 0), two_rounds.differences(c["rows"], g["rows"], -1)
        b["comparison"][name] = {
            "cpu_acc": c["rows"][-1]["personalized_acc"], "gpu_acc": g["rows"][-1]["personalized_acc"],
            "cpu_s": c["seconds"], "gpu_s": g["seconds"], "identical": c["digest"] == g["digest"],
            "first": first, "last": last,
            "within_tolerance": first["loss"] <= two_rounds.TOLERANCE["loss"] and first["acc"] <= two_rounds.TOLERANCE["acc"],
        }  # fmt: skip
    for side in ("gpu", "cpu"):
        for r in b[side].values():
            r.pop("rows", None)
    save()


# --- c. the papers' protocols per round ---------------------------------------------------------------


def protocol_config(sweep: str, setting: str, method: str, quick: bool) -> RunConfig:
    from fedtail.sweep import load_sweep

    plan = load_sweep(HERE / sweep, settings=[setting], methods=[method], seeds=[0])
    config = plan.runs[0].config
    raw = config.model_dump(mode="json") | {"checkpoint_every": 0}
    if quick:
        raw["train"] = raw["train"] | {"local_epochs": 1, "local_steps": 2}
    return RunConfig.model_validate(raw)


def seconds_per_round(config: RunConfig, rounds: int) -> dict[str, Any]:
    """Rounds 1..``rounds`` of ``config`` (each evaluated as the protocol schedules it); the mean wall
    time of rounds 2..``rounds`` (round 1 pays the one-off costs)."""
    dataset, partition = prepare(config)
    start = time.perf_counter()
    sim = Simulation(config, dataset, partition)
    setup = time.perf_counter() - start
    marks = [time.perf_counter()]
    try:
        for rnd in range(1, rounds + 1):
            sim.run_round(rnd)
            if config.plan.evaluates(rnd):
                sim.evaluate(rnd)
            synchronize(sim.device)
            marks.append(time.perf_counter())
    finally:
        sim.executor.close()
    per_round = (marks[-1] - marks[1]) / (rounds - 1)
    return {"workers": config.workers, "setup_s": round(setup, 2), "first_round_s": round(marks[1] - marks[0], 3),
            "seconds_per_round": round(per_round, 3)}  # fmt: skip


def committed_cpu(folder: str) -> dict[str, Any] | None:
    """Seconds per round of a committed 2-core run (whole run: its wall time over its rounds)."""
    from fedtail.machine import describe_run_machine

    path = HERE / folder / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return {"seconds_per_round": round(summary["wall_time_s"] / summary["rounds"], 2),
            "machine": describe_run_machine(summary), "run": str(path.relative_to(HERE.parent))}  # fmt: skip


def part_c(args: argparse.Namespace, out: dict[str, Any], save: Callable[[], None]) -> None:
    c: dict[str, Any] = out.setdefault("c", {})
    for name, (sweep, setting, method, folder) in PROTOCOLS.items():
        config = protocol_config(sweep, setting, method, args.quick).model_copy(update={"device": args.device})
        entry: dict[str, Any] = {"config": f"benchmarks/{sweep} [{setting}] {method} seed 0", "cpu_2core": committed_cpu(folder)}
        entry["device"] = [seconds_per_round(config.model_copy(update={"workers": w}), args.protocol_rounds)
                           for w in (1, args.protocol_workers)]  # fmt: skip
        cpu = entry["cpu_2core"]
        if cpu is not None:
            best = min(r["seconds_per_round"] for r in entry["device"])
            entry["speedup_over_2core"] = round(cpu["seconds_per_round"] / best, 1)
        c[name] = entry
        save()


# --- the report -------------------------------------------------------------------------------------------


def markdown(out: dict[str, Any]) -> str:
    """The GPU section of benchmarks/RESULTS.md from the results."""
    m = out["machine"]
    dev = m.get("device", {})
    gpu = dev.get("name", dev.get("type", "?"))
    lines = [
        f"## On a GPU (`python benchmarks/gpu.py`, also `make bench-gpu`; {out['date']})", "",
        f"Measured on {gpu} ({dev.get('memory_gb', '?')} GiB, CUDA {dev.get('cuda', '?')}, driver "
        f"{dev.get('driver', '?')}; torch {m.get('torch')}, Python {m.get('python')}; host CPU {m.get('cpu')}, "
        f"{m.get('cores')} cores), code {out['code'].get('commit', '?')}, command `{out['command']}`.", "",
    ]  # fmt: skip
    a = out.get("a")
    if a:
        bare = sum(a["bare_samples_per_s"]) / len(a["bare_samples_per_s"])
        lines += ["### a. Engine throughput (FedAvg, 50 clients, 20 % a round, batch 64, `cnn-fmnist`)", "",
                  "| run | samples/s | against the bare loop | against FL serial | same results as serial |",
                  "|---|---:|---:|---:|---|",
                  f"| bare loop (before, after) | {a['bare_samples_per_s'][0]:,.0f}, {a['bare_samples_per_s'][1]:,.0f} | 1 | | |",
                  f"| FL serial | {a['serial']['samples_per_s']:,.0f} | **{a['efficiency_serial']:.3f}** (target ≥ 0.9) | 1 | "
                  f"repeated: {'yes' if a['serial_repeat_identical'] else 'NO'} |",
                  f"| FL serial, deterministic kernels off | {a['nondeterministic']['samples_per_s']:,.0f} | "
                  f"{a['nondeterministic']['samples_per_s'] / bare:.3f} | "
                  f"{a['nondeterministic']['samples_per_s'] / a['serial']['samples_per_s']:.3f} | |"]  # fmt: skip
        for w, r in a.get("workers", {}).items():
            lines.append(f"| FL, {w} workers on one GPU | {r['samples_per_s']:,.0f} | {r['samples_per_s'] / bare:.3f} | "
                         f"**{r['speedup_over_serial']:.2f}** (target ≥ 2.5) | {'yes' if r['identical_to_serial'] else 'NO'} |")
        launch = a.get("launch_overhead", {})
        for key, value in launch.items():
            if value is not None:
                lines.append(f"| bare loop, {key.removesuffix('_samples_per_s').replace('vmap', 'vmap over ')}"
                             f"{' clients' if key.startswith('vmap') else ' (CUDA graph)'} | {value:,.0f} | {value / bare:.3f} | | |")
        t = a.get("transfers_per_round")
        if t:
            lines += ["", f"One FedAvg round ({t['clients']} clients, {t['batches']} training batches): {t['htod']} "
                      f"host-to-device and {t['dtoh']} device-to-host copies, {t['syncs']} waits for the device "
                      "(torch.profiler, serial)."]
        lines.append("")
    b = out.get("b", {}).get("comparison")
    if b:
        lines += ["### b. Every algorithm, 2 rounds, GPU against CPU (`benchmarks/two_rounds.py`'s protocol)", "",
                  f"Tolerance after the first evaluated round: training loss {two_rounds.TOLERANCE['loss']:g} relative, "
                  f"mean accuracy {two_rounds.TOLERANCE['acc']:g} absolute.", "",
                  "| algorithm | CPU acc | GPU acc | loss, round 1 (rel.) | acc, round 1 | acc, end | CPU s | GPU s | verdict |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for name, r in b.items():
            if "error" in r:
                lines.append(f"| {name} | | | | | | | | failed: {r['error']} |")
                continue
            verdict = "identical" if r["identical"] else ("within" if r["within_tolerance"] else "**beyond**")
            lines.append(f"| {name} | {r['cpu_acc']:.4f} | {r['gpu_acc']:.4f} | {r['first']['loss']:.1e} | "
                         f"{r['first']['acc']:.4f} | {r['last']['acc']:.4f} | {r['cpu_s']:.1f} | {r['gpu_s']:.1f} | {verdict} |")
        lines.append("")
    c = out.get("c")
    if c:
        lines += ["### c. The papers' protocols, seconds per round (rounds 2-5)", "",
                  "| protocol | 2-core CPU (committed run) | GPU serial | GPU, workers | speed-up |", "|---|---:|---:|---:|---:|"]
        for name, e in c.items():
            cpu = e["cpu_2core"]
            serial, more = e["device"]
            lines.append(f"| {name} (`{e['config']}`) | {cpu['seconds_per_round'] if cpu else '?'} ({cpu['machine'] if cpu else 'none'}) | "
                         f"{serial['seconds_per_round']} | {more['seconds_per_round']} ({more['workers']}) | "
                         f"{e.get('speedup_over_2core', '?')}× |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu.json"))
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--parts", default="abc")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, measures nothing")
    args = parser.parse_args(argv)
    args.rounds, args.local_epochs, args.batch_size = (1, 1, 64) if args.quick else (10, 2, 64)
    args.clients = 10 if args.quick else 50
    args.workers = [2] if args.quick else [2, 4, 8]
    args.vmap = [2] if args.quick else [4, 8]
    args.algorithms = ["fedavg", "fedproto"] if args.quick else None
    args.b_extra = {"train": {"local_steps": 2}} if args.quick else {}
    args.protocol_rounds, args.protocol_workers = (2, 2) if args.quick else (5, 4)
    resolve(args.device)  # bad input before anything runs
    out: dict[str, Any] = {
        "date": date.today().isoformat(), "command": "python benchmarks/gpu.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(resolve(args.device)), "code": code_info(),
        "quick": args.quick,
    }  # fmt: skip

    def save() -> None:
        args.out.write_text(json.dumps(out, indent=1, default=str))

    start = time.perf_counter()
    # b last: the longest, and the targets are a's and c's
    for part, run in (("a", part_a), ("c", part_c), ("b", part_b)):
        if part in args.parts:
            began = time.perf_counter()
            run(args, out, save)
            out.setdefault("seconds", {})[part] = round(time.perf_counter() - began, 1)
            print(f"part {part}: {out['seconds'][part]} s", flush=True)
            save()
    out["seconds"]["total"] = round(time.perf_counter() - start, 1)
    save()
    text = markdown(out)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
