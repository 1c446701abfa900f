"""A description of the machine, for sweep.json, each run's summary.json and report headers.

The CPU model name alone does not tell two machines of one kind apart: the same "AMD EPYC" has
run with and without AVX-512, and convolution-heavy runs are much slower without it. So the
vector instructions torch dispatches to are recorded too, and run times are compared only between
runs that name the same.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info(device: Any = None) -> dict[str, Any]:
    """Platform, CPU model and vector instructions, core count, memory (GiB), Python and torch
    versions; with a compute ``device`` (a ``torch.device``), a ``device`` entry too: its type,
    and for a GPU its name, memory, CUDA, cuDNN and driver versions
    (:func:`fedtail.engine.device.describe_device`)."""
    try:
        import torch

        torch_version = torch.__version__
        capability = current_capability()  # e.g. "AVX2", "AVX512"
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = capability = None
    info = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_capability": capability,
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "python": platform.python_version(),
        "torch": torch_version,
    }
    if device is not None:
        from fedtail.engine.device import describe_device

        info["device"] = describe_device(device)
    return info


def gpu_name(info: dict[str, Any]) -> str | None:
    """The GPU a machine description (or a run piece) names, or None for a CPU run."""
    device = info.get("device")
    return device.get("name") if isinstance(device, dict) and device.get("type") == "cuda" else None


def describe(info: dict[str, Any]) -> str:
    mem = info.get("memory_gb")
    return ", ".join(
        [
            str(info.get("platform", "?")),
            f"CPU {info.get('cpu', '?')}" + (f" ({info['cpu_capability']})" if info.get("cpu_capability") else ""),
            f"{info.get('cores', '?')} cores",
            f"{mem:g} GiB RAM" if isinstance(mem, (int, float)) else "memory unknown",
            *([f"GPU {gpu_name(info)}"] if gpu_name(info) else []),
            f"Python {info.get('python', '?')}",
            f"torch {info.get('torch', '?')}",
        ]
    )


def current_capability() -> str | None:
    """The vector instructions torch dispatches to on this machine ("AVX2", "AVX512"), or None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return torch.backends.cpu.get_cpu_capability()


def run_capability(summary: dict[str, Any]) -> str | None:
    """The vector instructions a finished run ran on, from its ``summary.json`` ("AVX2"; "AVX512,
    then AVX2" for a run resumed on another machine); None when unknown for any of its pieces."""
    pieces = summary.get("pieces")
    if not isinstance(pieces, list) or not pieces:  # a summary from before pieces were recorded
        machine = summary.get("machine")
        pieces = [machine] if isinstance(machine, dict) else [{}]
    found = [p.get("cpu_capability") if isinstance(p, dict) else None for p in pieces]
    if not all(found):
        return None
    return ", then ".join(c for i, c in enumerate(found) if i == 0 or c != found[i - 1])


def describe_run_machine(summary: dict[str, Any]) -> str:
    """A finished run's machine, as far as it decides speed and rounding: CPU model and the
    instructions of each piece, cores, torch. (The platform string names the kernel build, which
    changes between otherwise equal machines, so it is left out.)"""
    info = summary.get("machine")
    if not isinstance(info, dict):
        return "not recorded (finished before fedtail recorded it)"
    cap = run_capability(summary) or "instructions not recorded"
    gpu = f", GPU {gpu_name(info)}" if gpu_name(info) else ""
    return f"CPU {info.get('cpu', '?')} ({cap}), {info.get('cores', '?')} cores{gpu}, torch {info.get('torch', '?')}"
