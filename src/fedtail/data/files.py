"""A user's own data: ``--dataset npz:FILE`` and ``--dataset folder:DIR``.

``npz:FILE`` holds arrays

- ``x``: images N×C×H×W (uint8 0–255, or floats) or feature vectors N×D (floats);
- ``y``: N integer labels (any integers: they are numbered 0..C−1 in sorted order, and the
  original values are kept as the class names);
- ``client`` (optional): N integer client ids, for ``--partition natural``;
- ``split`` (optional): N markers, ``"train"``/``"test"`` (or 0 = train, 1 = test).

``folder:DIR`` holds one sub-folder per class of PNG/JPEG images (``DIR/cat/1.png``), or one
level of client folders above them (``DIR/hospital-a/cat/1.png``: the client folders become
client ids 0, 1, ... in sorted order). Images are read with Pillow; all must have one size, and
are stored grey (1 channel) when every image is grey, else RGB.

Without split markers, 20 % of the rows of every class (of every client, when there are client
ids) form the test split, drawn with a fixed seed (0) so every run sees the same split.
Normalisation: images are scaled to [0, 1] and normalised per channel, feature vectors per
feature, with the training split's mean and standard deviation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedtail.data.base import Dataset, Split
from fedtail.errors import ConfigError, DataError

TEST_SHARE = 0.2
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def load_file_dataset(spec: str, **options) -> Dataset:
    """``npz:FILE`` or ``folder:DIR`` (see the module docstring)."""
    if options:
        raise ConfigError(f"dataset {spec!r} takes no options, got {', '.join(sorted(options))}")
    kind, _, where = spec.partition(":")
    if not where:
        raise ConfigError(f"--dataset {spec!r}: give a path after '{kind}:'")
    path = Path(where).expanduser()
    if kind == "npz":
        x, y, client, split = _read_npz(path)
    else:
        x, y, client, split = _read_folder(path)
    return _dataset(spec, x, y, client, split)


def _read_npz(path: Path):
    if not path.is_file():
        raise DataError(f"--dataset npz:{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as err:  # numpy raises several kinds for a file that is not an .npz
        raise DataError(f"--dataset npz:{path}: not a readable .npz file ({err})") from None
    where = f"npz:{path}"
    for key in ("x", "y"):
        if key not in data.files:
            raise DataError(f"{where}: no array {key!r} (found: {', '.join(data.files) or 'none'})")
    x, y = data["x"], data["y"]
    n = len(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: 'y' must be a 1-D integer array (got shape {y.shape}, {y.dtype})")
    if x.ndim not in (2, 4) or x.shape[0] != n:
        raise DataError(f"{where}: 'x' must be N×C×H×W or N×D with N = len(y) = {n} (got shape {x.shape})")
    if not (np.issubdtype(x.dtype, np.number)):
        raise DataError(f"{where}: 'x' must be numeric (got {x.dtype})")
    if x.dtype != np.uint8 and not np.isfinite(x).all():
        raise DataError(f"{where}: 'x' holds NaN or inf values")
    client = data["client"] if "client" in data.files else None
    if client is not None and (client.shape != (n,) or not np.issubdtype(client.dtype, np.integer)):
        raise DataError(f"{where}: 'client' must be N = {n} integer ids (got shape {client.shape}, {client.dtype})")
    split = None
    if "split" in data.files:
        raw = data["split"]
        if raw.shape != (n,):
            raise DataError(f"{where}: 'split' must have N = {n} markers (got shape {raw.shape})")
        if raw.dtype.kind in "US":
            values = set(np.unique(raw.astype(str)))
            if not values <= {"train", "test"}:
                raise DataError(f"{where}: 'split' markers must be 'train' or 'test' (got {sorted(values)})")
            split = raw.astype(str) == "test"
        elif np.issubdtype(raw.dtype, np.integer) or raw.dtype == bool:
            if not set(np.unique(raw).tolist()) <= {0, 1}:
                raise DataError(f"{where}: integer 'split' markers must be 0 (train) or 1 (test)")
            split = raw.astype(bool)
        else:
            raise DataError(f"{where}: 'split' must hold 'train'/'test' strings or 0/1 (got {raw.dtype})")
    return x, y, client, split


def _read_folder(path: Path):
    from PIL import Image

    if not path.is_dir():
        raise DataError(f"--dataset folder:{path}: no such folder")
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    if not subdirs:
        raise DataError(f"folder:{path}: no class folders inside")
    nested = not any(f.suffix.lower() in IMAGE_SUFFIXES for f in subdirs[0].iterdir() if f.is_file())
    groups = [(i, sorted(p for p in d.iterdir() if p.is_dir())) for i, d in enumerate(subdirs)] if nested else [
        (None, subdirs)
    ]
    class_names = sorted({c.name for _, classes in groups for c in classes})
    if not class_names:
        raise DataError(f"folder:{path}: no class folders with images inside")
    images, labels, clients = [], [], []
    for cid, classes in groups:
        for folder in classes:
            for file in sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES):
                try:
                    with Image.open(file) as img:
                        images.append(img.convert("RGB") if img.mode not in ("L", "RGB") else img.copy())
                except Exception as err:
                    raise DataError(f"folder:{path}: cannot read image {file} ({err})") from None
                labels.append(class_names.index(folder.name))
                clients.append(cid)
    if not images:
        raise DataError(f"folder:{path}: no PNG or JPEG images found")
    sizes = {img.size for img in images}
    if len(sizes) > 1:
        raise DataError(f"folder:{path}: images differ in size ({sorted(sizes)[:3]}); resize them to one size")
    mode = "L" if all(img.mode == "L" for img in images) else "RGB"
    arrays = [np.asarray(img.convert(mode), dtype=np.uint8) for img in images]
    x = np.stack(arrays)
    x = x[:, None] if mode == "L" else x.transpose(0, 3, 1, 2)
    y = np.asarray(class_names)[labels]  # names, numbered like npz labels below
    client = np.asarray(clients, dtype=np.int64) if nested else None
    return x, y, client, None


def _dataset(spec: str, x: np.ndarray, y: np.ndarray, client: np.ndarray | None, is_test: np.ndarray | None) -> Dataset:
    names, y = np.unique(y, return_inverse=True)
    y = y.astype(np.int64)
    if client is not None:
        _, client = np.unique(client, return_inverse=True)  # ids 0..K-1 in sorted order
        client = client.astype(np.int64)
    if is_test is None:
        is_test = _carve_test(y, client)
    train, test = ~is_test, is_test
    if not train.any() or not test.any():
        raise DataError(f"{spec}: both the train and the test split need rows (got {int(train.sum())} and {int(test.sum())})")
    images = x.ndim == 4
    if images and x.dtype == np.uint8:
        xt = torch.from_numpy(np.ascontiguousarray(x))
        scaled = x[train].astype(np.float64) / 255.0
    else:
        xt = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32)))
        scaled = x[train].astype(np.float64)
    axes = (0, 2, 3) if images else (0,)
    mean = scaled.mean(axis=axes)
    std = np.maximum(scaled.std(axis=axes), 1e-6)  # a constant channel or feature must not divide by 0
    yt = torch.from_numpy(y)

    def split(mask: np.ndarray) -> Split:
        rows = torch.from_numpy(np.flatnonzero(mask))
        ids = None if client is None else torch.from_numpy(client[mask])
        return Split(xt[rows].contiguous(), yt[rows].contiguous(), ids)

    return Dataset(
        name=spec,
        train=split(train),
        test=split(test),
        num_classes=len(names),
        input_shape=tuple(int(s) for s in x.shape[1:]),
        mean=tuple(round(float(m), 6) for m in mean),
        std=tuple(round(float(s), 6) for s in std),
        class_names=tuple(str(n) for n in names),
    )


def _carve_test(y: np.ndarray, client: np.ndarray | None) -> np.ndarray:
    """TEST_SHARE of every class (of every client) as the test split, seed 0; at least one row
    stays in training wherever a (client, class) has one."""
    rng = np.random.default_rng(0)
    is_test = np.zeros(len(y), dtype=bool)
    keys = y if client is None else client * (int(y.max()) + 1) + y
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        k = int(round(TEST_SHARE * len(rows)))
        k = min(k, len(rows) - 1)
        if k > 0:
            is_test[rng.choice(rows, size=k, replace=False)] = True
    return is_test
