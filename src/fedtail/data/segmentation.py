"""Semantic-segmentation datasets: Cityscapes from its official folders, and ``fmnist-seg``, a
CPU-scale set generated from Fashion-MNIST, so MuPFL's segmentation protocol (Sec. 4.1, Tables III–IV)
runs on any machine.

Masks are uint8 class ids, :data:`~fedtail.data.base.IGNORE` (255) where no loss or metric counts.

Readings (MuPFL's paper is silent on them):

- **Primary class.** The partition schemes place samples by one label; a street scene holds many
  classes. An image's primary class (:func:`primary_classes`) is one of the classes (not the
  background) it shows on at least ``MIN_SHARE`` of its pixels: in image order, the one given the
  fewest images so far (ties: the rarer class in training pixels). Nearly every Cityscapes image is
  mostly road, sky and buildings beside rarer classes, so "its largest class" would leave the rare
  classes without images and "its rarest class" the frequent ones; balancing gives every class the
  images that show it, as evenly as the images allow, and the long-tail cut (``--imbalance``,
  CReFF's [40] profile over the class index) then makes the per-class image counts long-tailed, as
  the paper's IF does.
- **Background.** Cityscapes gets a 20th class, ``background`` (train id 19): what MuPFL's client
  labelling "sets ... as background", i.e. the classes a client does not keep. Cityscapes' own void
  pixels (train id 255) stay ignored, in every labelling. fmnist-seg's empty canvas is its background.
- **fmnist-seg.** Each canvas (``size``² pixels, black) holds ``items`` Fashion-MNIST items (drawn
  uniformly between the two values), each scaled to a side drawn from ``scale`` (pixels) and placed
  uniformly inside the canvas; a later item covers an earlier one. A pixel belongs to an item where
  the scaled item is brighter than ``THRESHOLD`` (its silhouette); its label is the item's class.
  Train canvases use the training images, test canvases the test images. Deterministic in ``seed``,
  cached as an ``.npz`` in the user cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedtail.data.base import IGNORE, Dataset, Split
from fedtail.errors import ConfigError, DataError

MIN_SHARE = 0.01  # a class counts as shown by an image from this share of its pixels on
THRESHOLD = 32  # fmnist-seg: an item's pixels brighter than this (of 255) are its silhouette

FMNIST_SEG_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    "background",
)  # fmt: skip

# Cityscapes' 19 evaluation classes by train id, and the label id each comes from. Source: the
# official label table, cityscapesScripts `cityscapesscripts/helpers/labels.py` (`trainId`); every
# other label id (void, and the classes Cityscapes does not evaluate) has train id 255.
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation",
    "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle", "background",
)  # fmt: skip
# The class names of each segmentation data set, by its registry name (the report's per-class tables).
CLASS_NAMES = {"fmnist-seg": FMNIST_SEG_CLASSES, "cityscapes": CITYSCAPES_CLASSES}
CITYSCAPES_LABEL_IDS = (7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33)
CITYSCAPES_MEAN = (0.485, 0.456, 0.406)  # ImageNet's, as MobileNet-V3's pretraining and torchvision use
CITYSCAPES_STD = (0.229, 0.224, 0.225)


def save_npz(path: Path, arrays: dict[str, np.ndarray], compressed: bool = True) -> None:
    """``arrays`` as one ``.npz`` at ``path``, written whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    (np.savez_compressed if compressed else np.savez)(tmp, **arrays)
    os.replace(tmp, path)


def cityscapes_train_ids() -> np.ndarray:
    """The 256-entry uint8 table from Cityscapes label ids (``*_labelIds.png``) to train ids."""
    table = np.full(256, IGNORE, dtype=np.uint8)
    table[list(CITYSCAPES_LABEL_IDS)] = np.arange(len(CITYSCAPES_LABEL_IDS), dtype=np.uint8)
    return table


def pixel_counts(masks: torch.Tensor, num_classes: int) -> np.ndarray:
    """Pixels of each class in ``masks`` (N, H, W) (ignored pixels left out), as int64."""
    return image_pixel_counts(masks, num_classes).sum(dim=0).numpy()


def image_pixel_counts(masks: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, num_classes) int64 on the CPU: each image's pixels of each class (ignored pixels left out)."""
    out = torch.zeros(len(masks), num_classes, dtype=torch.int64)
    chunk = max(1, 2**22 // max(1, masks[0].numel())) if len(masks) else 1  # ~4M pixels at a time
    for start in range(0, len(masks), chunk):
        m = masks[start : start + chunk].cpu().reshape(min(chunk, len(masks) - start), -1).long()
        rows = torch.arange(len(m)).unsqueeze(1).expand_as(m)
        valid = m < num_classes
        cells = (rows * num_classes + m)[valid]
        out[start : start + len(m)] = torch.bincount(cells, minlength=len(m) * num_classes).view(len(m), num_classes)
    return out


def primary_classes(masks: torch.Tensor, classes: int, frequency: np.ndarray) -> torch.Tensor:
    """Each image's primary class (see the module docstring): in image order, among the classes
    below ``classes`` (the background excluded) that cover at least ``MIN_SHARE`` of its pixels, the
    one given the fewest images so far, the one with the lowest ``frequency`` on ties; with none
    that large, its largest such class. DataError for an image showing none."""
    counts = image_pixel_counts(masks, classes).numpy()
    pixels = masks.shape[1] * masks.shape[2]
    shown = counts >= max(1, int(np.ceil(MIN_SHARE * pixels)))
    rarity = np.argsort(np.argsort(np.asarray(frequency[:classes]), kind="stable"), kind="stable")
    given = np.zeros(classes, dtype=np.int64)
    primary = np.empty(len(counts), dtype=np.int64)
    for i, (row, show) in enumerate(zip(counts, shown)):
        candidates = np.flatnonzero(show)
        if len(candidates):
            c = candidates[np.lexsort((rarity[candidates], given[candidates]))[0]]
        elif row.any():
            c = int(row.argmax())
        else:
            raise DataError(f"image {i} shows none of the {classes} classes (only background or ignored pixels)")
        primary[i] = c
        given[c] += 1
    return torch.from_numpy(primary)


def segmentation_dataset(
    name: str, train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
    class_names: tuple[str, ...], mean: tuple[float, ...], std: tuple[float, ...],
) -> Dataset:
    """A segmentation :class:`Dataset` (the last class the background) from uint8 images and masks,
    with each image's primary class; DataError for masks that do not fit."""
    num_classes = len(class_names)
    for what, (x, y) in (("train", train), ("test", test)):
        if x.dim() != 4 or y.dim() != 3 or x.shape[0] != y.shape[0] or x.shape[2:] != y.shape[1:]:
            raise DataError(f"{name} {what}: images {tuple(x.shape)} and masks {tuple(y.shape)} do not match "
                            "(N, C, H, W) against (N, H, W)")
        bad = (y >= num_classes) & (y != IGNORE)
        if bad.any():
            raise DataError(f"{name} {what}: mask value {int(y[bad][0])} is no class (0..{num_classes - 1}) "
                            f"and not the ignore label {IGNORE}")
    classes = num_classes - 1
    frequency = pixel_counts(train[1], classes)
    splits = [Split(x, y, primary=primary_classes(y, classes, frequency)) for x, y in (train, test)]
    return Dataset(name, splits[0], splits[1], num_classes, tuple(int(s) for s in train[0].shape[1:]), mean, std,
                   class_names, task="segmentation", background=classes)  # fmt: skip


# -- fmnist-seg -------------------------------------------------------------------------------------
def _canvases(
    images: np.ndarray, labels: np.ndarray, n: int, size: int, items: tuple[int, int], scale: tuple[int, int],
    rng: np.random.Generator, background: int,
) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((n, size, size), dtype=np.uint8)
    y = np.full((n, size, size), background, dtype=np.uint8)
    counts = rng.integers(items[0], items[1] + 1, size=n)
    source = torch.from_numpy(images)
    for i in range(n):
        for _ in range(int(counts[i])):
            j = int(rng.integers(len(images)))
            side = int(rng.integers(scale[0], scale[1] + 1))
            top, left = (int(v) for v in rng.integers(0, size - side + 1, size=2))
            item = F.interpolate(source[j][None, None].float(), size=(side, side), mode="bilinear",
                                 align_corners=False)[0, 0].round().clamp_(0, 255).to(torch.uint8).numpy()  # fmt: skip
            on = item > THRESHOLD
            x[i, top : top + side, left : left + side][on] = item[on]
            y[i, top : top + side, left : left + side][on] = labels[j]
    return x, y


def load_fmnist_seg(
    directory: str | Path, size: int = 32, train: int = 6000, test: int = 1000, items: tuple[int, int] | list[int] = (1, 3),
    scale: tuple[int, int] | list[int] = (14, 24), seed: int = 0, cache: bool = True,
) -> Dataset:
    """``fmnist-seg`` (see the module docstring) from the Fashion-MNIST files in ``directory``."""
    from fedtail.data.locate import cache_root
    from fedtail.data.mnist import FMNIST_MEAN, FMNIST_STD, load_fmnist

    items, scale = tuple(int(v) for v in items), tuple(int(v) for v in scale)
    if len(items) != 2 or not 1 <= items[0] <= items[1]:
        raise ConfigError(f"fmnist-seg: items must be [min, max] with 1 <= min <= max, got {list(items)}")
    if len(scale) != 2 or not 4 <= scale[0] <= scale[1] <= size:
        raise ConfigError(f"fmnist-seg: scale must be [min, max] sides with 4 <= min <= max <= size ({size}), got {list(scale)}")
    if train < 1 or test < 1:
        raise ConfigError(f"fmnist-seg: train and test must be positive canvas counts, got {train} and {test}")
    options = {"size": size, "train": train, "test": test, "items": items, "scale": scale, "seed": seed, "v": 1}
    # the source files too (name, size, modification time): canvases of other Fashion-MNIST files are others
    source_files = sorted(p for p in Path(directory).iterdir() if p.is_file()) if Path(directory).is_dir() else [Path(directory)]
    options["source"] = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in source_files]
    key = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "fmnist-seg" / f"{key}.npz"
    if cache and path.is_file():
        with np.load(path) as z:
            arrays = [torch.from_numpy(z[k]) for k in ("x_train", "y_train", "x_test", "y_test")]
    else:
        source = load_fmnist(directory)
        rng_train, rng_test = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        background = len(FMNIST_SEG_CLASSES) - 1
        made = [
            _canvases(s.x[:, 0].numpy(), s.labels, n, size, items, scale, rng, background)
            for s, n, rng in ((source.train, train, rng_train), (source.test, test, rng_test))
        ]
        arrays = [torch.from_numpy(a) for pair in made for a in pair]
        if cache:
            save_npz(path, dict(zip(("x_train", "y_train", "x_test", "y_test"), (a.numpy() for a in arrays))))
    x_train, y_train, x_test, y_test = arrays
    return segmentation_dataset("fmnist-seg", (x_train[:, None], y_train), (x_test[:, None], y_test),
                                FMNIST_SEG_CLASSES, FMNIST_MEAN, FMNIST_STD)  # fmt: skip


# -- Cityscapes -------------------------------------------------------------------------------------
def find_cityscapes(data_dir: str | Path | None) -> Path:
    """The Cityscapes root (the folder holding ``leftImg8bit/`` and ``gtFine/``); DataError naming
    what is missing otherwise."""
    from fedtail.data.locate import ENV_DATA_DIR, cache_root

    roots = [Path(data_dir).expanduser()] if data_dir is not None else []
    if os.environ.get(ENV_DATA_DIR):
        roots.append(Path(os.environ[ENV_DATA_DIR]).expanduser())
    roots.append(cache_root())
    tried = []
    for root in roots:
        for d in (root, root / "cityscapes"):
            if (d / "leftImg8bit").is_dir() and (d / "gtFine").is_dir():
                return d
            tried.append(d)
    halves = [(d, sub) for d in tried for sub in ("leftImg8bit", "gtFine") if (d / sub).is_dir()]  # one of the two
    missing = next((f"{d}/{'gtFine' if sub == 'leftImg8bit' else 'leftImg8bit'}" for d, sub in halves), None)
    where = ", ".join(str(d) for d in tried)
    raise DataError(
        f"Cityscapes not found in {where}" + (f" ({missing}/ is missing)" if missing else "")
        + ": it cannot be downloaded without an account; put the official leftImg8bit/ and gtFine/ "
        "folders (from leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip) under --data-dir"
    )


def _cityscapes_split(root: Path, split: str, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image

    images = sorted((root / "leftImg8bit" / split).glob("*/*_leftImg8bit.png"))
    if not images:
        raise DataError(f"{root / 'leftImg8bit' / split}/ holds no <city>/*_leftImg8bit.png images")
    table = cityscapes_train_ids()
    xs, ys = [], []
    for path in images:
        stem = path.name[: -len("_leftImg8bit.png")]
        label = root / "gtFine" / split / path.parent.name / f"{stem}_gtFine_labelIds.png"
        if not label.is_file():
            raise DataError(f"{path} has no label file {label}")
        with Image.open(path) as im, Image.open(label) as lab:
            if im.size != lab.size:
                raise DataError(f"{path} is {im.size[0]}x{im.size[1]} but {label} {lab.size[0]}x{lab.size[1]}")
            if lab.mode not in ("L", "P", "I", "I;16"):
                raise DataError(f"{label}: expected a one-channel label-id image, got mode {lab.mode}")
            xs.append(np.asarray(im.convert("RGB").resize((width, height), Image.BILINEAR)).transpose(2, 0, 1))
            ids = np.asarray(lab.resize((width, height), Image.NEAREST)).astype(np.int64)
        if ids.min() < 0 or ids.max() > 255:
            raise DataError(f"{label}: label ids must lie in 0..255, got {int(ids.min())}..{int(ids.max())}")
        ys.append(table[ids])
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def load_cityscapes(directory: str | Path | None, height: int = 256, width: int = 512, cache: bool = True) -> Dataset:
    """Cityscapes' fine annotations (train: 2975 images, val: 500 as the test split) resized to
    ``height`` × ``width`` (images bilinear, labels nearest), label ids mapped to the 19 train ids
    plus the background (see the module docstring). The resized arrays are cached as an ``.npz`` in
    the user cache, keyed by the size and every source file's name, size and modification time."""
    from fedtail.data.locate import cache_root

    if height < 8 or width < 8:
        raise ConfigError(f"cityscapes: height and width must be at least 8 pixels, got {height}x{width}")
    root = find_cityscapes(directory)
    files = sorted(p for sub in ("leftImg8bit", "gtFine") for p in (root / sub).glob("*/*/*.png"))
    stamp = [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    key = hashlib.sha256(json.dumps({"height": height, "width": width, "files": stamp, "v": 1}).encode()).hexdigest()[:16]
    path = cache_root() / "cityscapes-resized" / f"{key}.npz"
    names = ("x_train", "y_train", "x_test", "y_test")
    if cache and path.is_file():
        with np.load(path) as z:
            x_train, y_train, x_test, y_test = (torch.from_numpy(z[k]) for k in names)
    else:
        (x_train, y_train), (x_test, y_test) = (_cityscapes_split(root, s, height, width) for s in ("train", "val"))
        if cache:
            save_npz(path, dict(zip(names, (t.numpy() for t in (x_train, y_train, x_test, y_test)))), compressed=False)
    return segmentation_dataset("cityscapes", (x_train, y_train), (x_test, y_test), CITYSCAPES_CLASSES,
                                CITYSCAPES_MEAN, CITYSCAPES_STD)  # fmt: skip
