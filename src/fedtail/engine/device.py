"""The compute device of a run (``--device``), and the one place where tensors cross to and from it.

The rule of the engine: **what it holds is on the CPU, what a half computes is on the device.**

- The dataset's tensors are moved to the device once per process (:meth:`Dataset.to
  <fedtail.data.base.Dataset.to>`: uint8 stays uint8, normalisation runs on the device), and so
  are the clients' index views; a batch is an index look-up there.
- The workspace models and optimizers live on the device (:class:`~fedtail.engine.context.Workspace`).
- :class:`~fedtail.algorithms.base.Message` tensors, client state, server and edge state,
  checkpoints and Flower messages are device-neutral (CPU): the executor moves a task's message
  and state to the device before the client half runs (:func:`to_device`) and its reply and new
  state back (:func:`to_host`), one copy each per task, never per batch. A checkpoint written on
  a GPU resumes on a CPU and back.
- Random draws stay on the CPU generators they always used (shuffles, initial weights, sampled
  features) and are moved afterwards, so a seed draws the same numbers on every device. Dropout
  layers draw from the device's own generator (seeded per task like the CPU's), so they differ
  between CPU and GPU.

``auto`` is the first CUDA device when torch sees one, else the CPU. On CUDA the engine asks for
deterministic kernels (:func:`configure`): same seed, same GPU model, same results, serial or
with workers; ``deterministic = false`` lifts that for speed (``benchmarks/gpu.py`` measures it).
TF32 stays off, so GPU arithmetic is float32 like the CPU's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import torch

from fedtail.algorithms.base import Message
from fedtail.config import DEVICES
from fedtail.errors import ConfigError

# cuBLAS needs a fixed workspace for deterministic results (NVIDIA's cuBLAS docs, "Results reproducibility")
CUBLAS_WORKSPACE = ":4096:8"


def resolve(spec: str) -> torch.device:
    """The device ``--device`` names: ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``,
    ``cuda`` (the first GPU), ``cuda:N``. A CUDA device torch does not see is a ConfigError."""
    spec = str(spec).strip().lower()
    if not re.fullmatch(DEVICES, spec):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N (got {spec!r})")
    if spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {spec}: torch sees no CUDA device (torch {torch.__version__}, built "
            f"{'without CUDA' if torch.version.cuda is None else 'for CUDA ' + torch.version.cuda}); "
            "use --device cpu or auto"
        )
    index = int(spec.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"--device {spec}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def worker_device(device: torch.device, spec: str, worker: int) -> torch.device:
    """The device of client worker ``worker`` (0-based): with ``cuda`` or ``auto`` on a machine with
    several GPUs the workers are spread over them round-robin; an explicit ``cuda:N`` keeps them all there."""
    if device.type != "cuda" or ":" in str(spec):
        return device
    return torch.device("cuda", worker % torch.cuda.device_count())


def configure(device: torch.device, deterministic: bool = True) -> None:
    """Process-wide settings for computing on ``device``; nothing changes on the CPU.

    CUDA: deterministic kernels (``torch.use_deterministic_algorithms``, cuDNN deterministic and
    not benchmarking, the cuBLAS workspace variable, set before cuBLAS starts) unless
    ``deterministic`` is False; TF32 off for matrix products and convolutions (float32 as on the CPU).
    """
    if device.type != "cuda":
        return
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(device)


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside it (dicts, lists, tuples, messages) on ``device``.

    A tensor already there is the same object (so on the CPU nothing is copied); containers are
    rebuilt, a read-only mapping stays read-only.
    """
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if type(value) is dict:
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, MappingProxyType):
        return MappingProxyType(to_device(dict(value), device))
    if type(value) is list:
        return [to_device(v, device) for v in value]
    if type(value) is tuple:
        return tuple(to_device(v, device) for v in value)
    if isinstance(value, Message):
        return replace(value, tensors=to_device(value.tensors, device))
    return value


def to_host(value: Any) -> Any:
    """``value`` with every tensor inside it on the CPU (:func:`to_device` to the CPU)."""
    return to_device(value, torch.device("cpu"))


def describe_device(device: torch.device) -> dict[str, Any]:
    """The compute device for ``summary.json``: its type, and for a GPU its name, memory, compute
    capability, the CUDA and cuDNN versions torch was built with and the driver's version."""
    if device.type != "cuda":
        return {"type": device.type}
    props = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda",
        "index": device.index,
        "name": props.name,
        "memory_gb": round(props.total_memory / 1024**3, 1),
        "capability": f"{props.major}.{props.minor}",
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "driver": driver_version(),
    }


@lru_cache(maxsize=1)
def driver_version() -> str | None:
    """The NVIDIA driver's version, as ``nvidia-smi`` reports it (None without it)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None
