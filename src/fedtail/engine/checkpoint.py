"""Checkpoints of a run: the state after a round, written atomically, loaded without pickled classes.

A checkpoint (``checkpoint.pt`` in the run folder, format version :data:`VERSION`) is one
``torch.save`` of plain containers, loaded with ``torch.load(weights_only=True)``:

    {"format": "fedtail-checkpoint", "version": 1,
     "config":     the run's config (as in config.json),
     "round":      the last completed round r (its evaluation, if any, included),
     "elapsed_s":  wall seconds of the run up to the checkpoint (stops excluded: engine/clock.py),
     "suspended_s": the seconds of stops left out of them (absent in older checkpoints: 0),
     "server":     ServerHalf.state_dict(),  "edge": EdgeHalf.state_dict(),
     "clients":    {client id: the client's ctx.state},
     "meter":      the cost meters (Meter.as_dict()),
     "rows":       every metrics row recorded so far (metrics.jsonl is rewritten from them),
     "round_logs": the round logs since the last evaluation,
     "rng":        the main process's torch / numpy / python global random states,
     "pieces":     (added by the runner) the round each process of the run began with, and its
                   CPU and vector instructions, for summary.json}

Nothing else needs saving: client sampling is a function of (seed, round), client tasks are
reseeded from (seed, round, call, client), and the workspace models are overwritten before use.

Values inside the states are kept as they are when they are tensors, numbers, strings, bytes,
None, lists, tuples or dicts; numpy arrays and scalars, sets, torch and numpy random generators
and fitted scikit-learn estimators are stored as tagged dicts of plain data (:func:`encode`) and
rebuilt by :func:`decode`. Anything else is a :class:`CheckpointError` naming where it sits.
"""

from __future__ import annotations

import importlib
import io
import os
import random
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from fedtail.errors import FedtailError
from fedtail.report.runfiles import CHECKPOINT, CHECKPOINT_INFO, write_json

FORMAT = "fedtail-checkpoint"
VERSION = 1
TAG = "__fedtail__"  # key of the tagged dicts that stand for non-plain values
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


class CheckpointError(FedtailError):
    """A state that cannot be checkpointed, or a checkpoint that cannot be read or does not fit."""


# --- plain containers ---------------------------------------------------------------------------


def _array(value: np.ndarray, where: str) -> dict[str, Any]:
    if value.dtype.hasobject:
        raise CheckpointError(f"{where}: a numpy array of Python objects cannot be checkpointed")
    raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    return {TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "data": torch.from_numpy(raw.copy())}


def _unarray(tagged: dict[str, Any]) -> np.ndarray:
    raw = tagged["data"].numpy().tobytes()
    return np.frombuffer(raw, dtype=np.dtype(tagged["dtype"])).reshape(tagged["shape"]).copy()


def encode(value: Any, where: str = "state") -> Any:
    """``value`` as plain containers that ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return value
    if isinstance(value, np.ndarray):
        return _array(value, where)
    if isinstance(value, np.generic):
        return {TAG: "numpy-scalar", "array": _array(np.asarray(value), where)}
    if type(value) is list:
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if type(value) is tuple:
        return tuple(encode(v, f"{where}[{i}]") for i, v in enumerate(value))
    if type(value) is dict:
        if TAG not in value and all(type(k) in (str, int, bool, type(None)) for k in value):
            return {k: encode(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {TAG: "dict", "items": [(encode(k, where), encode(v, f"{where}[{k!r}]")) for k, v in value.items()]}
    if type(value) in (set, frozenset):
        try:  # a set's order varies from process to process (string hashing): written sorted where it can be
            items = sorted(value)
        except TypeError:
            items = list(value)
        return {TAG: type(value).__name__, "items": [encode(v, where) for v in items]}
    if isinstance(value, torch.Generator):
        return {TAG: "torch-generator", "state": value.get_state()}
    if isinstance(value, np.random.Generator):
        bits = value.bit_generator
        return {TAG: "numpy-generator", "bit_generator": type(bits).__name__, "state": encode(bits.state, where)}
    if _is_estimator(value):
        cls = type(value)
        return {TAG: "sklearn", "class": f"{cls.__module__}.{cls.__qualname__}", "vars": encode(vars(value), where)}
    raise CheckpointError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot hold: "
        "keep tensors, numbers, strings, lists, dicts or numpy arrays in the state "
        "(or give the half a state_dict/load_state_dict that does)"
    )


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if type(value) is list:
        return [decode(v) for v in value]
    if type(value) is tuple:
        return tuple(decode(v) for v in value)
    if type(value) is not dict:
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "ndarray":
        return _unarray(value)
    if kind == "numpy-scalar":
        return _unarray(value["array"])[()]
    if kind == "dict":
        return {decode(k): decode(v) for k, v in value["items"]}
    if kind in ("set", "frozenset"):
        return {"set": set, "frozenset": frozenset}[kind](decode(v) for v in value["items"])
    if kind == "torch-generator":
        generator = torch.Generator(device="cpu")
        generator.set_state(value["state"])
        return generator
    if kind == "numpy-generator":
        bits = getattr(np.random, value["bit_generator"])()
        bits.state = decode(value["state"])
        return np.random.Generator(bits)
    if kind == "sklearn":
        module, _, name = value["class"].rpartition(".")
        if not module.startswith("sklearn."):
            raise CheckpointError(f"checkpoint names the class {value['class']}, which is not a scikit-learn estimator")
        cls = getattr(importlib.import_module(module), name)
        estimator = cls.__new__(cls)
        vars(estimator).update(decode(value["vars"]))
        return estimator
    raise CheckpointError(f"unknown tagged value {kind!r} in the checkpoint (written by a newer fedtail?)")


def _is_estimator(value: Any) -> bool:
    """A scikit-learn estimator (fitted or not): rebuilt from its class name and attributes."""
    module = type(value).__module__
    if not module.startswith("sklearn."):
        return False
    from sklearn.base import BaseEstimator

    return isinstance(value, BaseEstimator)


# --- the global random streams of the main process ----------------------------------------------


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": encode(np.random.get_state(legacy=False), "numpy random state"),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(decode(state["numpy"]))
    random.setstate(state["python"])


# --- files ---------------------------------------------------------------------------------------


def open_private(tmp: Path) -> BinaryIO:
    """A new file at ``tmp`` for writing, readable by its owner only (mode 0600), for the files that
    hold clients' states: a file left there by a killed write (with its mode) is removed first."""
    tmp.unlink(missing_ok=True)
    return os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def save(run_dir: str | Path, state: dict[str, Any]) -> dict[str, Any]:
    """Write ``checkpoint.pt`` atomically (temporary file, then rename), then ``checkpoint.json``.

    ``checkpoint.pt`` is readable by its owner only (mode 0600, :func:`open_private`, as the client
    state files are): it holds every client's state (its personal model) and, under DP on Flower, the secret that the noise and the sampling come from
    (``engine/guard.py``), which a reader of the file could use to remove the noise.

    ``checkpoint.json`` (round, rounds, config, size, seconds) lets the sweep see a checkpoint
    without reading it; returns it.
    """
    start = time.perf_counter()
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp) as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    info = {
        "format": FORMAT,
        "version": VERSION,
        "round": state["round"],
        "rounds": state["config"]["rounds"],
        "elapsed_s": state["elapsed_s"],
        "bytes": path.stat().st_size,
        "write_s": round(time.perf_counter() - start, 3),
        "config": state["config"],
    }
    write_json(run_dir / CHECKPOINT_INFO, info)
    return info


def load(source: str | Path | bytes) -> dict[str, Any]:
    """A checkpoint file written by :func:`save` (or the bytes of :func:`to_bytes`), checked for format and version."""
    name = "the checkpoint" if isinstance(source, bytes) else str(source)
    try:
        state = torch.load(
            io.BytesIO(source) if isinstance(source, bytes) else source, map_location="cpu", weights_only=True
        )
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {source}") from None
    except Exception as err:  # a truncated or foreign file
        raise CheckpointError(f"cannot read {name}: {err}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{name} is not a fedtail checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{name} has format version {state.get('version')}, not {VERSION} (another fedtail)")
    return state


def to_bytes(state: dict[str, Any]) -> bytes:
    """The bytes :func:`save` would write (tests, and checkpoints kept in memory)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
