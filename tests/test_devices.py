"""The compute device: --device, tensors on the run's device only, nothing per batch on the host.

A CPU-only machine cannot run a GPU, but it can make the GPU's one hazard visible: on a GPU the
default device (the CPU) is not the compute device, so a tensor made without ``device=`` lands
on the wrong one. Here the default device is ``meta`` while the run computes on an explicit
``cpu``: a tensor made without a device is then a meta tensor, which fails loudly as soon as it
meets data, or holds no values and changes a result. Every algorithm must therefore give exactly
the rows and states it gives without the meta default.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import tiny_config
from fedtail.algorithms.base import Message, shuffled
from fedtail.config import RunConfig
from fedtail.engine import checkpoint
from fedtail.engine.device import describe_device, resolve, to_device, to_host, worker_device
from fedtail.engine.training import evaluate, train_epochs
from fedtail.errors import ConfigError
from fedtail.report.runfiles import config_diff
from helpers import PACKAGED, SMOKE, algorithm_config, invoke, run, same, simulation, strip_timing

# Option sets that reach client and server code the defaults leave alone.
VARIANTS: list[tuple[str, dict]] = [
    ("mupfl", {"options": {"bavd": True}}),
    ("mupfl", {"options": {"bavd": True, "bavd_map": "accumulated", "bavd_mask": "value", "bavd_map_shape": "hw"}}),
    ("mupfl", {"options": {"reading": "personal", "pkcf_order": "after-aggregation"}}),
    ("mupfl", {"options": {"bavd": True, "bavd_map": "epoch", "bavd_eval": True, "bavd_rescale": False}}),
    ("apfl", {"options": {"mix_w": "previous", "eval_w": "local", "personal_start": "initial"}}),
    ("perfedavg", {"options": {"variant": "hf", "steps": "pfllib"}}),
    ("fedproto", {"options": {"predict": "head", "prototypes": "training", "keep_absent": False}}),
    ("fedpac", {"options": {"statistics": "trained", "missing_prototype": "local", "alignment": "l2sq"}}),
    ("feddistill", {"options": {"regularizer": "mse", "logits": "inference", "exclude_self": False}}),
    ("gldp", {"options": {"predict": "local", "relation": "distance", "global_model": "mean_classifier"}}),
    ("gldp", {"options": {"predict": "head", "glpr_weighting": "none", "alignment": "l2sq"}}),
    ("fedic", {"options": {"teacher": "ensemble", "distill_weight": 1.0, "prior_tau": 1.0}}),
    ("fedic", {"options": {"ensemble_weighting": "uniform", "gate_persist": False, "distill_data": "all"}}),
    ("fedbabu", {"options": {"finetune": "head"}}),
    ("fedac", {"options": {"similarity": "l2", "weighted": True, "first_start": "uploaded-mean"}}),
    ("fesem", {"options": {"init": "random", "cold_start": "random", "m_step": "round"}}),
    ("ifca", {"options": {"init": "common"}}),
    ("fedrema", {"options": {"random_feature": "code", "head_weighting": "samples"}}),
    ("fedrema", {"options": {"client_training": "alternate-align", "similarity_rounds": [1, 2], "mds": False}}),
    ("fedgroup", {"options": {"newcomer_start": "global_mean", "eta_g": 0.5, "mu": 0.1}}),
    ("cgpfl", {"options": {"warm_start": True, "first_start": "init"}}),
    ("fedrep", {"options": {"final_finetune": True}}),
    ("ditto", {"options": {"personal_init": "initial", "personal_epochs": 2}}),
    ("fedavg", {"train": {"local_steps": 3, "grad_clip": 1.0, "momentum": 0.9}, "eval_split": "val",
                "partition": {"val_fraction": 0.2}}),
    ("fedavg", {"client_state": "disk"}),
]


def _cases() -> list:
    cases = [pytest.param(name, {}, id=name) for name in PACKAGED]
    seen: dict[str, int] = {}
    for name, extra in VARIANTS:
        seen[name] = seen.get(name, 0) + 1
        cases.append(pytest.param(name, extra, id=f"{name}-variant{seen[name]}"))
    return cases


def _states(sim) -> dict:
    return {
        "server": checkpoint.encode(sim.server.state_dict()),
        "edge": checkpoint.encode(sim.edge.state_dict()),
        "clients": {cid: checkpoint.encode(s) for cid, s in sim.client_state.items()},
    }


def _merge(config: RunConfig, extra: dict) -> RunConfig:
    """``config`` with ``extra``'s sections merged key by key."""
    raw = config.model_dump(mode="json")
    for key, value in extra.items():
        raw[key] = raw.get(key, {}) | value if isinstance(value, dict) else value
    return RunConfig.model_validate(raw)


@pytest.mark.parametrize(("name", "extra"), _cases())
def test_every_algorithm_makes_its_tensors_on_the_run_device(name, extra, tmp_path):
    """Under a meta default device every algorithm finishes with exactly the plain run's rows and states."""
    config = _merge(algorithm_config(name, device="cpu", checkpoint_every=0), extra)
    plain_rows, plain = run(config)
    plain_states = _states(plain)
    with torch.device("meta"):
        meta_rows, meta = run(config)
        meta_states = _states(meta)
    assert strip_timing(meta_rows) == strip_timing(plain_rows)
    assert same(meta_states, plain_states)


def test_the_plug_in_example_makes_its_tensors_on_the_run_device(monkeypatch):
    """The contract holds for an algorithm written outside fedtail (examples/my_fedprox.py)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    config = algorithm_config("my_fedprox:ALGORITHM", device="cpu", checkpoint_every=0, options={"mu": 0.1})
    plain_rows, plain = run(config)
    with torch.device("meta"):
        meta_rows, meta = run(config)
    assert strip_timing(meta_rows) == strip_timing(plain_rows) and same(_states(meta), _states(plain))


def test_the_meta_default_catches_a_tensor_made_without_its_device():
    """The check above can fail: a tensor made without ``device=`` is a meta tensor there."""
    data = torch.arange(6.0)

    def careless(x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(len(x))  # no device=: lands on the default device

    assert torch.equal(careless(data), data + 1)
    with torch.device("meta"), pytest.raises(RuntimeError, match="device"):
        careless(data)


# --- the setting --------------------------------------------------------------------------------


def test_auto_is_the_cpu_without_a_gpu_and_cuda_then_is_bad_input(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve("auto") == torch.device("cpu") and resolve("CPU") == torch.device("cpu")
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=f"--device {spec}: torch sees no CUDA device"):
            resolve(spec)
    with pytest.raises(ConfigError, match="auto, cpu, cuda or cuda:N"):
        resolve("gpu")


def test_auto_is_the_first_gpu_and_workers_spread_over_several(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve("auto") == torch.device("cuda", 0)
    assert resolve("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="sees 2 CUDA device"):
        resolve("cuda:2")
    gpu = torch.device("cuda", 0)
    assert [worker_device(gpu, "auto", w) for w in range(3)] == [torch.device("cuda", i) for i in (0, 1, 0)]
    assert worker_device(torch.device("cuda", 1), "cuda:1", 5) == torch.device("cuda", 1)  # one GPU named
    assert worker_device(torch.device("cpu"), "cpu", 3) == torch.device("cpu")


def test_the_device_is_validated_recorded_and_does_not_change_a_runs_identity(tmp_path):
    with pytest.raises(ConfigError, match="--device must be auto, cpu, cuda or cuda:N"):
        tiny_config(device="gpu")
    assert tiny_config(device="CUDA:1").device == "cuda:1"
    default = tiny_config().model_dump(mode="json")
    assert "device" not in default and "deterministic" not in default  # config.json as before the setting
    assert tiny_config(device="cpu").model_dump(mode="json")["device"] == "cpu"
    other = tiny_config(device="cuda:3", deterministic=False).model_dump(mode="json")
    assert config_diff(default, other) == []  # a run resumes, and a sweep finds it done, on any device


def test_cli_device_cuda_without_a_gpu_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    result = invoke("run", *SMOKE, "--device", "cuda", "--out", out)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda: torch sees no CUDA device"), result.output
    assert not out.exists()  # nothing written


def test_summary_names_the_device_of_the_run(tmp_path):
    import fedtail

    result = fedtail.run(algorithm="fedavg", dataset="synthetic", model="mlp", rounds=1, clients=4, device="cpu",
                         out=str(tmp_path / "run"))
    assert result.summary["machine"]["device"] == {"type": "cpu"}
    assert "gpu" not in result.summary["pieces"][0]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["device"] == "cpu"
    assert describe_device(torch.device("cpu")) == {"type": "cpu"}


# --- crossing between host and device -----------------------------------------------------------


def test_to_device_moves_every_tensor_and_keeps_the_containers():
    inner = torch.ones(3)
    value = {"a": [inner, (torch.zeros(2), 4)], "gen": torch.Generator(), "s": "x"}
    moved = to_device(value, torch.device("meta"))
    assert moved["a"][0].device.type == "meta" and moved["a"][1][0].device.type == "meta"
    assert moved["a"][1][1] == 4 and moved["s"] == "x" and moved["gen"] is value["gen"]
    assert isinstance(moved["a"][1], tuple) and inner.device.type == "cpu"  # the original is untouched
    read_only = to_device(MappingProxyType({"w": inner}), torch.device("meta"))
    assert isinstance(read_only, MappingProxyType) and read_only["w"].device.type == "meta"
    msg = to_device(Message("fit", {"w": inner}, {"k": 1}, {"m": 2.0}), torch.device("meta"))
    assert msg.kind == "fit" and msg.tensors["w"].device.type == "meta" and msg.config == {"k": 1}
    # on the device it is already on, nothing is copied
    host = to_host(value)
    assert host["a"][0] is inner


def test_shuffles_are_drawn_on_the_cpu_generator_and_land_on_the_index_device():
    index = torch.arange(10, 20)
    a = shuffled(index, torch.Generator().manual_seed(3))
    b = index[torch.randperm(10, generator=torch.Generator().manual_seed(3))]
    assert torch.equal(a, b)  # the stream and the order of the CPU runs are kept
    on_meta = shuffled(index.to("meta"), torch.Generator().manual_seed(3))  # drawn on the CPU, indexed on the device
    assert on_meta.device.type == "meta" and on_meta.shape == index.shape


# What reads a tensor's value back to the host (on a GPU each waits for the device): item() and
# float()/int() (``_local_scalar_dense``, ``item`` under inference mode), bool() (``is_nonzero``),
# nonzero() and boolean-mask indexing (the result's size).
_READS = {torch.ops.aten._local_scalar_dense, torch.ops.aten.item, torch.ops.aten.is_nonzero, torch.ops.aten.nonzero,
          torch.ops.aten.masked_select}  # fmt: skip


class HostReads(TorchDispatchMode):
    """Counts the reads of tensor values by the host while it is active (see ``_READS``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in _READS:
            self.count += 1
        elif func.overloadpacket is torch.ops.aten.index and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
        ):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _host_reads(epochs: int) -> tuple[int, int]:
    sim = simulation(tiny_config(device="cpu"))
    rt, cid = sim.executor.runtime, 0
    data = rt.views.at(1)[cid]
    model = rt.workspace.model()
    optimizer = rt.workspace.optimizer(model.parameters(), 0.05)
    with HostReads() as training:
        stats = train_epochs(model, optimizer, rt.workspace.dataset, data.train, epochs=epochs, batch_size=4,
                             generator=torch.Generator().manual_seed(0))
    with HostReads() as evaluation:
        evaluate(model, rt.workspace.dataset, data.eval_split, data.eval_index.repeat(epochs), 5, batch_size=4)
    assert stats.steps >= 8 * epochs  # many batches
    with HostReads() as reading:
        assert stats.loss > 0
    assert reading.count == 1  # the loss is read when it is asked for
    return training.count, evaluation.count


def test_training_and_evaluation_read_nothing_back_per_batch():
    """Training reads nothing back (its loss is read when asked for), an evaluation its loss once."""
    assert _host_reads(1) == _host_reads(4) == (0, 1)


def test_the_read_counter_sees_every_kind_of_read():
    x = torch.arange(4.0)
    for read in (lambda: float(x[0]), lambda: bool(x[1]), lambda: x.nonzero(), lambda: x[x > 1], lambda: x.item() if False else x[0].item()):
        with HostReads() as reads:
            read()
        assert reads.count >= 1
    with torch.inference_mode(), HostReads() as reads:
        float(x.sum())
    assert reads.count >= 1


@pytest.mark.parametrize("name", PACKAGED)
def test_no_client_half_reads_back_per_batch_or_epoch(name, monkeypatch):
    """A client task reads as many values back with 3 local epochs as with 1: none per batch or epoch."""
    from fedtail.engine.executors import ClientRuntime

    counts = []
    original = ClientRuntime.run
    for epochs in (1, 3):
        reads = HostReads()

        def counted(self, task, reads=reads):
            with reads:
                return original(self, task)

        monkeypatch.setattr(ClientRuntime, "run", counted)
        run(algorithm_config(name, device="cpu", rounds=2, checkpoint_every=0, train={"local_epochs": epochs}))
        counts.append(reads.count)
    assert counts[0] == counts[1], f"{name}: {counts[0]} reads with 1 local epoch, {counts[1]} with 3"


# --- Flower ---------------------------------------------------------------------------------------


def test_a_supernode_takes_its_own_device_from_its_node_config():
    pytest.importorskip("flwr")
    from fedtail.flower import FlowerError
    from fedtail.flower.node import NodeSettings, hello

    assert NodeSettings.from_node_config({"clients": "0"}).device == "auto"
    assert NodeSettings.from_node_config({"clients": "0", "device": "CPU"}).device == "cpu"
    with pytest.raises(FlowerError, match="node config device='gpu'"):
        NodeSettings.from_node_config({"clients": "0", "device": "gpu"})
    config = tiny_config(device="cuda:7")  # the server's device: not the node's
    answer = hello({"config": config.model_dump_json()}, {"clients": "0,1", "device": "cpu"})
    assert answer["clients"] == [0, 1] and answer["device"] == "cpu"
