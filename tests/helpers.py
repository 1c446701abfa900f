"""Plain helpers shared by the test files (fixtures and tiny_raw/tiny_config stay in conftest.py).

Sections: running simulations; calling a client half directly; comparing models and partitions;
fake channels for calling a server half directly; planted data; option validation; the CLI.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import tiny_config, tiny_raw
from fedtail.algorithms import ALGORITHMS
from fedtail.algorithms.base import Message
from fedtail.algorithms.clustering import flatten, float_keys, unflatten
from fedtail.cli.main import app
from fedtail.config import RunConfig
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.callbacks import Rows
from fedtail.engine.executors import ClientRuntime, Task
from fedtail.engine.simulation import Simulation
from fedtail.errors import ConfigError
from fedtail.components import algorithm_options

# --- running simulations -----------------------------------------------------------------------


def simulation(config: RunConfig, rows: list | None = None) -> Simulation:
    """A simulation ready to run; its evaluation rows are appended to ``rows`` if given."""
    dataset, partition = prepare(config)
    return Simulation(config, dataset, partition, callbacks=[] if rows is None else [Rows(rows)])


def run_with_summary(config: RunConfig) -> tuple[dict, list[dict], Simulation]:
    """Run to the end: the summary, every evaluation row, and the finished simulation."""
    rows: list[dict] = []
    sim = simulation(config, rows)
    summary = sim.run()
    return summary, rows, sim


def run(config: RunConfig) -> tuple[list[dict], Simulation]:
    """Run to the end: every evaluation row and the finished simulation."""
    _, rows, sim = run_with_summary(config)
    return rows, sim


def strip_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


def without_global(rows: list[dict]) -> list[dict]:
    """Rows without timing, global-model metrics and cluster logs (what FedAvg cannot have)."""
    out = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k != "elapsed_s" and not k.startswith("global_")}
        kept["rounds_log"] = [{k: v for k, v in r.items() if k != "clustering"} for r in row["rounds_log"]]
        out.append(kept)
    return out


def assert_serial_and_parallel_agree(config: RunConfig) -> tuple[Simulation, Simulation]:
    """Run ``config`` with one worker and with two: the rows must agree exactly. Returns both runs."""
    serial_rows, serial = run(config.model_copy(update={"workers": 1}))
    parallel_rows, parallel = run(config.model_copy(update={"workers": 2}))
    assert strip_timing(serial_rows) == strip_timing(parallel_rows)
    return serial, parallel


# --- every algorithm ---------------------------------------------------------------------------

# algorithms that need options, data or a partition of their own to do something in 4 tiny rounds
SPECIAL = {
    "fedic": dict(
        partition={"server_samples_per_class": 8, "server_unlabelled": 60, "imbalance": 5.0},
        options={"distill_steps": 4, "finetune_steps": 4, "gate_steps": 4, "unlabelled_batch": 32},
    ),
    "gldp": dict(staged=True, partition={"stages": 2}, options={"head_epochs": 1}),  # checkpoint at the stage end
    "fedgroup": dict(options={"num_groups": 2, "pretrain_clients": 3}),
    "flhc": dict(options={"cluster_round": 1, "num_clusters": 2}),
    "mupfl": dict(edges=2),  # the edge tier
    "fedac": dict(options={"pca_every": 1}),
}
PACKAGED = sorted(name for name, spec in ALGORITHMS.items() if spec.server.__module__.startswith("fedtail."))


def algorithm_config(name: str, **overrides):
    special = dict(SPECIAL.get(name, {}))
    build = staged if special.pop("staged", False) else tiny_config
    return build(**({"algorithm": name, "rounds": 4, "checkpoint_every": 2} | special | overrides))



def same(a, b) -> bool:
    """Equal, recursively; tensors and arrays bit for bit (with dtypes), NaN equal to NaN."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b



# --- calling a client half directly ------------------------------------------------------------


def runtime(config: RunConfig) -> ClientRuntime:
    """The engine's in-process client runner, to call a client half directly."""
    dataset, partition = prepare(config)
    return ClientRuntime(config, dataset, partition)


def set_options(rt: ClientRuntime, config: RunConfig, **options) -> None:
    """Give the runner's clients other algorithm options (validated as a run's would be)."""
    rt.options = algorithm_options(config.model_copy(update={"options": options}))


def set_finetune(rt: ClientRuntime, **settings) -> None:
    """Give the runner's evaluation tasks other fine-tuning settings (``RunConfig.finetune``)."""
    from fedtail.config import FinetuneConfig

    finetune = FinetuneConfig(**settings)
    rt.finetune = finetune if finetune.active else None


def fit(rt: ClientRuntime, cid: int, tensors: dict, state: dict | None = None) -> tuple[Message, dict]:
    result = rt.run(Task(cid, 1, 0, Message("fit", tensors), {} if state is None else state))
    return result.reply, result.state


def evaluate(rt: ClientRuntime, cid: int, tensors: dict, state: dict) -> Message:
    return rt.run(Task(cid, 1, 1 << 20, Message("evaluate", tensors), state, read_only=True)).reply


# --- comparing models and partitions -----------------------------------------------------------


def distance(a: dict, b: dict) -> float:
    """Euclidean distance between two models, over all their tensors."""
    return float(sum((a[k].double() - b[k].double()).pow(2).sum() for k in a)) ** 0.5


def assert_same(a: dict, b: dict) -> None:
    """The same keys and bit-identical tensors."""
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def filled(template: dict, value: float) -> dict:
    """A model shaped like ``template`` with every entry equal to ``value``."""
    return {k: torch.full_like(v, value) for k, v in template.items()}


def same_partition(a, b) -> bool:
    """Equal up to renaming the clusters."""
    a, b = list(map(int, a)), list(map(int, b))
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


# --- fake channels, to call a server half directly ---------------------------------------------


def reply(tensors: dict, num_examples: float, **metrics: float) -> Message:
    """A client's reply carrying ``tensors`` and the sample count servers weight by."""
    return Message("reply", tensors, metrics={"num_examples": float(num_examples), **metrics})


class RecordingComm:
    """The channel API on top of ``stream``, keeping what the server logged."""

    def __init__(self) -> None:
        self.logged: dict = {}

    def stream(self, messages):
        raise NotImplementedError

    def exchange(self, messages):
        return dict(self.stream(messages))

    def log(self, **values) -> None:
        self.logged.update(values)


class ScriptedComm(RecordingComm):
    """Hands back prepared replies, in client-id order, and records what the server sent and logged."""

    def __init__(self, replies: dict[int, Message]) -> None:
        super().__init__()
        self.replies = replies
        self.sent: dict[int, Message] = {}

    def stream(self, messages):
        self.sent = dict(messages)
        for cid in sorted(messages):
            yield cid, self.replies[cid]


class PartialComm(ScriptedComm):
    """A :class:`ScriptedComm` whose clients without a prepared reply do not answer (failed, or rejected)."""

    def stream(self, messages):
        self.sent = dict(messages)
        for cid in sorted(messages):
            if cid in self.replies:
                yield cid, self.replies[cid]


class PlantedUpdateComm(RecordingComm):
    """A channel whose clients "train" by adding a planted update to the model they receive."""

    def __init__(self, delta: Callable[[int], dict], sizes) -> None:
        super().__init__()
        self.delta = delta
        self.sizes = sizes
        self.calls: list[tuple[str, list[int]]] = []
        self.replies: dict[int, Message] = {}  # each client's latest reply
        self.history: list[dict[int, Message]] = []  # the replies of each call

    def stream(self, messages):
        self.calls.append((next(iter(messages.values())).kind, sorted(messages)))
        self.history.append({})
        for cid in sorted(messages):
            start, d = messages[cid].tensors, self.delta(cid)
            tensors = {k: v + d[k] if k in d else v.clone() for k, v in start.items()}
            answer = reply(tensors, self.sizes[cid])
            self.replies[cid] = self.history[-1][cid] = answer
            yield cid, answer


def parity_deltas(sim: Simulation, scale: float = 0.01, seed: int = 0) -> Callable[[int], dict]:
    """Client c's update points along direction c % 2 (length growing with c, a little noise)."""
    init = sim.server_ctx.init_weights
    keys = float_keys(init)
    dim = len(flatten(init, keys))
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(2, dim, generator=g)
    noise = 0.1 * torch.randn(sim.num_clients, dim, generator=g)
    rows = [scale * (1 + c) * (directions[c % 2] + noise[c]) for c in range(sim.num_clients)]
    return lambda cid: unflatten(rows[cid], init, keys)


# --- planted data ------------------------------------------------------------------------------


def planted_groups(
    sizes: Sequence[int],
    dim: int,
    *,
    scale: float = 1.0,
    spread: float = 0.1,
    offset: float = 0.0,
    shuffle: bool = False,
    seed: int = 0,
) -> tuple[torch.Tensor, np.ndarray]:
    """Rows around random centres (``scale``·N(0, I)), ``sizes[k]`` of them around centre k; and their groups.

    ``spread`` is the noise around each centre; ``offset`` > 0 adds one random vector of that scale
    to every row (as models share one); ``shuffle`` mixes the groups' rows.
    """
    g = torch.Generator().manual_seed(seed)
    shared = offset * torch.randn(dim, generator=g) if offset else None
    centres = scale * torch.randn(len(sizes), dim, generator=g)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    if shuffle:
        truth = truth[torch.randperm(len(truth), generator=g).numpy()]
    base = centres[truth] if shared is None else shared + centres[truth]
    return base + spread * torch.randn(len(truth), dim, generator=g), truth


def planted_updates(groups: int = 2, per_group: int = 6, dim: int = 60, seed: int = 0):
    """Updates along ``groups`` random directions, with very different lengths and a little noise."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(groups, dim, generator=g)
    truth = np.repeat(np.arange(groups), per_group)
    lengths = torch.linspace(0.2, 5.0, len(truth))[torch.randperm(len(truth), generator=g)]
    rows = lengths[:, None] * (directions[truth] + 0.15 * torch.randn(len(truth), dim, generator=g))
    return rows, truth


# --- option validation -------------------------------------------------------------------------


def assert_config_error(algorithm: str, assignments: list[str], needle: str) -> None:
    """Building a tiny run of ``algorithm`` with these --set assignments fails, saying ``needle``."""
    with pytest.raises(ConfigError) as err:
        build_config(tiny_raw(algorithm=algorithm), assignments)
    assert needle in str(err.value)


# --- the command line --------------------------------------------------------------------------

runner = CliRunner()

# synthetic data, 5 classes, 6 clients (Dirichlet 0.5), 3 a round, 2 rounds of one epoch
SMOKE = [
    "--dataset", "synthetic", "--model", "mlp", "--partition", "dirichlet", "--alpha", "0.5",
    "--clients", "6", "--fraction", "0.5", "--rounds", "2", "--local-epochs", "1",
    "--batch-size", "16", "--lr", "0.05", "--set", "dataset_options.num_classes=5",
]  # fmt: skip

# synthetic data, 4 classes, 8 clients with 2 classes each (clear clusters), 4 a round, 3 rounds
CLUSTERED_SMOKE = [
    "--dataset", "synthetic", "--model", "mlp", "--partition", "pathological", "--classes-per-client", "2",
    "--clients", "8", "--fraction", "0.5", "--rounds", "3", "--local-epochs", "1",
    "--batch-size", "16", "--lr", "0.05", "--set", "dataset_options.num_classes=4",
]  # fmt: skip


def invoke(*args):
    """`fedtail ARGS...`, in process; the arguments are turned into strings."""
    return runner.invoke(app, [str(a) for a in args])


def invoke_run(out: Path, algorithm: str, *assignments: str, smoke: Sequence[str] = SMOKE, flags: Sequence[str] = ()):
    """`fedtail run` of ``algorithm`` on ``smoke`` plus ``flags`` (later flags win) and ``--set`` assignments."""
    sets = [arg for assignment in assignments for arg in ("--set", assignment)]
    return invoke("run", "--algorithm", algorithm, *smoke, *flags, *sets, "--out", out)


@dataclass
class CliRun:
    """What a finished `fedtail run` wrote: its folder, summary.json and the rows of metrics.jsonl."""

    out: Path
    summary: dict
    rows: list[dict]

    @property
    def final(self) -> dict:
        return self.summary["final"]

    @property
    def logs(self) -> list[dict]:
        """Every round's log entry, in order, from the rows' ``rounds_log``."""
        return [log for row in self.rows for log in row["rounds_log"]]

    @property
    def clustering(self) -> list[dict]:
        """Every round's ``clustering`` record, in order."""
        return [log["clustering"] for log in self.logs]


def run_cli(
    tmp_path: Path, algorithm: str, *assignments: str, smoke: Sequence[str] = SMOKE, flags: Sequence[str] = ()
) -> CliRun:
    """:func:`invoke_run` into ``tmp_path / "r"``; it must succeed. Returns what it wrote."""
    out = tmp_path / "r"
    res = invoke_run(out, algorithm, *assignments, smoke=smoke, flags=flags)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return CliRun(out, summary, rows)


def assert_fails_in_one_line(result, key: str) -> None:
    """A usage error (exit code 2) that names ``key``, without a traceback."""
    assert result.exit_code == 2, result.output
    assert key in result.output and "Traceback" not in result.output


# --- stage tasks -------------------------------------------------------------------------------

# 6 classes, 6 clients with 3 stage tasks of 2 classes each, 6 rounds = 2 per stage (blocks;
# staged(stage_schedule=None) is the default nested schedule: 2 rounds of global optimisation)
STAGED = dict(
    dataset_options={"num_classes": 6},
    partition={"scheme": "stages", "num_clients": 6, "stages": 3, "classes_per_stage": 2},
    rounds=6,
    stage_schedule="blocks",
)

# synthetic data, 4 classes, 4 clients with 2 stages of 2 classes, 2 a round, 4 rounds (2 per stage)
STAGE_SMOKE = [
    "--dataset", "synthetic", "--model", "mlp", "--partition", "stages", "--stages", "2",
    "--classes-per-stage", "2", "--clients", "4", "--fraction", "0.5", "--rounds", "4",
    "--rounds-per-stage", "2", "--stage-schedule", "blocks", "--local-epochs", "1", "--batch-size", "16", "--lr", "0.05",
    "--set", "dataset_options.num_classes=4",
]  # fmt: skip


def staged_raw(**overrides):
    """:func:`tiny_raw` of the STAGED setting; dict overrides merge into its sections."""
    merged = {k: STAGED[k] | v if isinstance(v, dict) and k in STAGED else v for k, v in overrides.items()}
    return tiny_raw(**(STAGED | merged))


def staged(**overrides):
    return build_config(staged_raw(**overrides))


# --- sweep files ---------------------------------------------------------------------------------


def sweep_base(rounds: int, *, train: bool = True, extra: str = "") -> str:
    """The [base] section of a tiny sweep file: synthetic data, 4 clients (Dirichlet 0.5), 2 a
    round; ``extra`` adds lines to [base] (e.g. ``checkpoint_every = 2``)."""
    text = f"""
[base]
dataset = "synthetic"
model = "mlp"
fraction = 0.5
rounds = {rounds}
{extra}
[base.dataset_options]
num_classes = 4
dim = 8
train_per_class = 30
test_per_class = 10
[base.partition]
scheme = "dirichlet"
num_clients = 4
alpha = 0.5
min_samples = 3
"""
    return text + ("[base.train]\nbatch_size = 16\nlr = 0.05\n" if train else "")


# --- hand-written gradients ----------------------------------------------------------------------


def softmax_regression_grad(W, b, x, y):
    """∇ of the mean cross-entropy of softmax(xWᵀ + b), written out: G = (p − onehot)/B."""
    p = torch.softmax(x @ W.T + b, dim=1)
    G = (p - torch.nn.functional.one_hot(y, W.shape[0]).to(p.dtype)) / len(y)
    return G.T @ x, G.sum(0)
