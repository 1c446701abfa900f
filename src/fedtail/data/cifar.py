"""CIFAR-10 / CIFAR-100 from the official python-pickle tarballs or their extracted folders."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtail.data.base import Dataset, Split
from fedtail.errors import DataError

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

# Only what the CIFAR pickles need (numpy arrays of bytes/ints): unpickling arbitrary
# globals from a downloaded file would run arbitrary code.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR file")
        if module.startswith("numpy.core") and int(np.__version__.split(".")[0]) >= 2:
            # Pickles from numpy 1 (the official files) name numpy.core, deprecated in numpy 2.
            module = "numpy._core" + module[len("numpy.core") :]
        return super().find_class(module, name)


def _unpickle(data: bytes, where: str) -> dict[bytes, Any]:
    try:
        obj = _SafeUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as exc:  # any unpickling failure means a corrupt file
        raise DataError(f"cannot read CIFAR pickle {where}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR pickle {where} holds {type(obj).__name__}, expected a dict")
    # Keys are bytes with encoding='bytes'; accept str keys too (re-pickled files).
    return {(k.encode() if isinstance(k, str) else k): v for k, v in obj.items()}


def _read_members(path: Path, folder: str, members: tuple[str, ...]) -> dict[str, bytes]:
    """Raw bytes of ``members`` from a tarball (read in place) or an extracted folder."""
    out: dict[str, bytes] = {}
    if path.is_dir():
        for m in members:
            try:
                out[m] = (path / m).read_bytes()
            except OSError as exc:
                raise DataError(f"cannot read {path / m}: {exc.strerror or exc}") from exc
        return out
    wanted = {f"{folder}/{m}": m for m in members}
    try:
        with tarfile.open(path, "r:*") as tf:
            for info in tf:  # one sequential pass: random access in a .tar.gz re-decompresses
                m = wanted.get(info.name.removeprefix("./"))
                if m is not None and info.isfile():
                    f = tf.extractfile(info)
                    if f is not None:
                        out[m] = f.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"corrupt or truncated CIFAR archive {path}: {exc}") from exc
    missing = [f"{folder}/{m}" for m in members if m not in out]
    if missing:
        raise DataError(f"CIFAR archive {path} lacks {', '.join(missing)}")
    return out


def _batch(blob: dict[bytes, Any], label_key: bytes, where: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    if b"data" not in blob or label_key not in blob:
        raise DataError(f"CIFAR batch {where} lacks b'data' or {label_key!r} (keys: {sorted(blob)})")
    data = np.asarray(blob[b"data"])
    labels = np.asarray(blob[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"CIFAR batch {where}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    if labels.shape != (data.shape[0],):
        raise DataError(f"CIFAR batch {where}: {data.shape[0]} images but {labels.shape} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"CIFAR batch {where}: labels outside 0..{num_classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels


def _split(parts: list[tuple[np.ndarray, np.ndarray]]) -> Split:
    # concatenate always copies: the result is contiguous and writable (torch.from_numpy needs that).
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return Split(torch.from_numpy(x), torch.from_numpy(y))


def _names(blob: dict[bytes, Any], key: bytes) -> tuple[str, ...]:
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in blob.get(key, ()))


def load_cifar10(path: str | Path) -> Dataset:
    """CIFAR-10 from cifar-10-python.tar.gz or the cifar-10-batches-py folder."""
    path = Path(path)
    train_names = tuple(f"data_batch_{i}" for i in range(1, 6))
    raw = _read_members(path, "cifar-10-batches-py", train_names + ("test_batch", "batches.meta"))
    blobs = {m: _unpickle(b, f"{path}:{m}") for m, b in raw.items()}
    train = _split([_batch(blobs[m], b"labels", f"{path}:{m}", 10) for m in train_names])
    test = _split([_batch(blobs["test_batch"], b"labels", f"{path}:test_batch", 10)])
    names = _names(blobs["batches.meta"], b"label_names") or tuple(str(i) for i in range(10))
    return Dataset("cifar10", train, test, 10, (3, 32, 32), CIFAR10_MEAN, CIFAR10_STD, names)


def load_cifar100(path: str | Path) -> Dataset:
    """CIFAR-100 (fine labels) from cifar-100-python.tar.gz or the cifar-100-python folder."""
    path = Path(path)
    raw = _read_members(path, "cifar-100-python", ("train", "test", "meta"))
    blobs = {m: _unpickle(b, f"{path}:{m}") for m, b in raw.items()}
    train = _split([_batch(blobs["train"], b"fine_labels", f"{path}:train", 100)])
    test = _split([_batch(blobs["test"], b"fine_labels", f"{path}:test", 100)])
    names = _names(blobs["meta"], b"fine_label_names") or tuple(str(i) for i in range(100))
    return Dataset("cifar100", train, test, 100, (3, 32, 32), CIFAR100_MEAN, CIFAR100_STD, names)
