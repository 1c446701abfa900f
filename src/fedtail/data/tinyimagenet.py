"""Tiny-ImageNet-200 from its official folder or zip (``tiny-imagenet-200/``).

The layout (Stanford CS231n's release): ``wnids.txt`` (the 200 class ids, one per line, their order
is the label order), ``words.txt`` (id → names), ``train/<wnid>/images/<wnid>_<k>.JPEG`` (500 a
class), ``val/images/val_<k>.JPEG`` with ``val/val_annotations.txt`` (file, wnid, box; tab-separated)
and ``test/images`` (no labels). The labelled validation images are the test split here, as in the
papers that report Tiny-ImageNet (GLDP's TinyImage); the unlabelled test images are not read.

Images are 64×64 RGB JPEGs, decoded once per process with Pillow into one uint8 (N, 3, 64, 64)
tensor per split (about 1.2 GB for the whole training split); a greyscale file is read as RGB.
Nothing is downloaded: the files must be present (``--data-dir``, ``$FEDTAIL_DATA_DIR``, ...).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import torch

from fedtail.data.base import Dataset, Split
from fedtail.errors import DataError

FOLDER = "tiny-imagenet-200"
ZIP = "tiny-imagenet-200.zip"
SIZE = 64
# per-channel statistics of the training split (the values commonly used with this data set)
MEAN, STD = (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)


class _Files:
    """Read access to the release, as a folder or inside its zip (names relative to tiny-imagenet-200/)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None
        if self.zip is not None:
            names = self.zip.namelist()
            prefix = next((n[: n.index(FOLDER) + len(FOLDER) + 1] for n in names if FOLDER + "/" in n), "")
            self.prefix = prefix
            self.names = {n[len(prefix):] for n in names if n.startswith(prefix)}

    def read(self, name: str) -> bytes:
        try:
            if self.zip is not None:
                return self.zip.read(self.prefix + name)
            return (self.path / name).read_bytes()
        except (KeyError, OSError) as exc:
            raise DataError(f"Tiny-ImageNet {self.path}: cannot read {name} ({exc})") from exc

    def listdir(self, folder: str) -> list[str]:
        """File names directly inside ``folder``, sorted."""
        if self.zip is not None:
            start = folder.rstrip("/") + "/"
            return sorted(n[len(start):] for n in self.names if n.startswith(start) and "/" not in n[len(start):] and n != start)
        directory = self.path / folder
        if not directory.is_dir():
            raise DataError(f"Tiny-ImageNet {self.path}: no folder {folder}")
        return sorted(p.name for p in directory.iterdir() if p.is_file())


def _decode(data: bytes, where: str) -> np.ndarray:
    from PIL import Image  # here: only this loader needs it

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # a truncated or foreign file
        raise DataError(f"Tiny-ImageNet: cannot decode {where}: {exc}") from exc
    if rgb.shape != (SIZE, SIZE, 3):
        raise DataError(f"Tiny-ImageNet: {where} is {rgb.shape[1]}x{rgb.shape[0]}, expected {SIZE}x{SIZE}")
    return rgb.transpose(2, 0, 1)


def _split(files: _Files, items: list[tuple[str, int]]) -> Split:
    x = np.empty((len(items), 3, SIZE, SIZE), dtype=np.uint8)
    for i, (name, _) in enumerate(items):
        x[i] = _decode(files.read(name), name)
    y = np.array([label for _, label in items], dtype=np.int64)
    return Split(torch.from_numpy(x), torch.from_numpy(y))


def load_tinyimagenet(path: str | Path) -> Dataset:
    """Tiny-ImageNet-200 from the ``tiny-imagenet-200`` folder or ``tiny-imagenet-200.zip``."""
    files = _Files(Path(path))
    wnids = [w.strip() for w in files.read("wnids.txt").decode().splitlines() if w.strip()]
    if len(set(wnids)) != len(wnids) or not wnids:
        raise DataError(f"Tiny-ImageNet {path}: wnids.txt lists {len(wnids)} ids, {len(set(wnids))} distinct")
    label = {w: i for i, w in enumerate(wnids)}
    train = [(f"train/{w}/images/{f}", label[w]) for w in wnids for f in files.listdir(f"train/{w}/images")
             if f.lower().endswith((".jpeg", ".jpg"))]  # fmt: skip
    val = []
    for line in files.read("val/val_annotations.txt").decode().splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[1] not in label:
            raise DataError(f"Tiny-ImageNet {path}: val_annotations.txt names {parts[1]!r}, not in wnids.txt")
        val.append((f"val/images/{parts[0]}", label[parts[1]]))
    if not train or not val:
        raise DataError(f"Tiny-ImageNet {path}: {len(train)} training and {len(val)} validation images found")
    names = dict.fromkeys(wnids, "")
    try:
        for line in files.read("words.txt").decode().splitlines():
            wnid, _, words = line.partition("\t")
            if wnid in names:
                names[wnid] = words.split(",")[0].strip()
    except DataError:  # words.txt is optional: the ids stand for the names
        pass
    class_names = tuple(names[w] or w for w in wnids)
    return Dataset("tinyimagenet", _split(files, train), _split(files, sorted(val)), len(wnids), (3, SIZE, SIZE),
                   MEAN, STD, class_names)  # fmt: skip
