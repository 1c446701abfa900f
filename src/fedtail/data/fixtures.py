"""Tiny datasets written in the real on-disk formats, for tests and for trying fedtail offline."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from fedtail.data.idx import write_idx
from fedtail.data.locate import CIFAR10_MEMBERS, MNIST_STEMS


def _images_labels(rng: np.random.Generator, n: int, shape: tuple[int, ...], k: int) -> tuple[np.ndarray, np.ndarray]:
    # Labels cycle through every class first so even tiny splits contain all of them.
    labels = (np.arange(n) % k)[rng.permutation(n)].astype(np.uint8 if k <= 256 else np.int64)
    images = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    return images, labels


def write_idx_dataset(
    directory: str | Path, n_train: int, n_test: int, gz: bool = True, num_classes: int = 10, seed: int = 0
) -> Path:
    """Write the four MNIST-format files (28x28 random images) into ``directory``; returns it."""
    d = Path(directory)
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    for img_stem, lab_stem, n in ((MNIST_STEMS[0], MNIST_STEMS[1], n_train), (MNIST_STEMS[2], MNIST_STEMS[3], n_test)):
        images, labels = _images_labels(rng, n, (28, 28), num_classes)
        write_idx(d / (img_stem + suffix), images, gz=gz)
        write_idx(d / (lab_stem + suffix), labels.astype(np.uint8), gz=gz)
    return d


def _cifar_members(n_train: int, n_test: int, classes: int, seed: int) -> dict[str, bytes]:
    """Member name -> pickled bytes, laid out like the official archives (bytes keys, protocol 2)."""
    if classes not in (10, 100):
        raise ValueError(f"classes must be 10 or 100, got {classes}")
    rng = np.random.default_rng(seed)

    def batch(n: int, label_key: bytes, drawn: tuple[np.ndarray, np.ndarray] | None = None) -> dict[bytes, object]:
        images, labels = drawn if drawn is not None else _images_labels(rng, n, (3 * 32 * 32,), classes)
        out: dict[bytes, object] = {b"data": images, label_key: [int(v) for v in labels]}
        if classes == 100:
            out[b"coarse_labels"] = [int(v) // 5 for v in labels]
        out[b"filenames"] = [f"img_{i}.png".encode() for i in range(n)]
        return out

    def dump(obj: object) -> bytes:
        return pickle.dumps(obj, protocol=2)

    if classes == 10:
        # Draw the whole train split, then cut it into the five official batches, so every
        # class appears in the split (as in the real data) even when it is tiny.
        images, labels = _images_labels(rng, n_train, (3 * 32 * 32,), classes)
        cuts = np.array_split(np.arange(n_train), 5)
        members = {
            f"data_batch_{i + 1}": dump(batch(len(c), b"labels", (images[c], labels[c]))) for i, c in enumerate(cuts)
        }
        members["test_batch"] = dump(batch(n_test, b"labels"))
        names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
        members["batches.meta"] = dump({b"label_names": names, b"num_vis": 3072})
        assert set(members) == set(CIFAR10_MEMBERS)
    else:
        members = {"train": dump(batch(n_train, b"fine_labels")), "test": dump(batch(n_test, b"fine_labels"))}
        members["meta"] = dump(
            {
                b"fine_label_names": [f"fine_{i}".encode() for i in range(100)],
                b"coarse_label_names": [f"coarse_{i}".encode() for i in range(20)],
            }
        )
    return members


def _folder(classes: int) -> str:
    return "cifar-10-batches-py" if classes == 10 else "cifar-100-python"


def write_cifar_tarball(path: str | Path, n_train: int, n_test: int, classes: int = 10, seed: int = 0) -> Path:
    """Write a cifar-10/100-python.tar.gz-style archive at ``path`` (a file or a folder to put it in)."""
    p = Path(path)
    if p.is_dir():
        p = p / ("cifar-10-python.tar.gz" if classes == 10 else "cifar-100-python.tar.gz")
    p.parent.mkdir(parents=True, exist_ok=True)
    folder = _folder(classes)
    with tarfile.open(p, "w:gz") as tf:
        for name, data in _cifar_members(n_train, n_test, classes, seed).items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return p


def write_cifar_folder(directory: str | Path, n_train: int, n_test: int, classes: int = 10, seed: int = 0) -> Path:
    """Write the extracted layout ``directory``/cifar-10-batches-py/ (or cifar-100-python/); returns it."""
    d = Path(directory) / _folder(classes)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in _cifar_members(n_train, n_test, classes, seed).items():
        (d / name).write_bytes(data)
    return d


def write_tinyimagenet(
    directory: str | Path, classes: int = 3, train_per_class: int = 4, val_per_class: int = 2, *, zipped: bool = False,
    seed: int = 0,
) -> Path:
    """A small Tiny-ImageNet release in the official layout (random 64x64 JPEGs), as the folder
    ``tiny-imagenet-200/`` in ``directory`` or, ``zipped``, as ``tiny-imagenet-200.zip``; returns it."""
    import zipfile

    from PIL import Image

    rng = np.random.default_rng(seed)
    wnids = [f"n{1000 + c:08d}" for c in range(classes)]
    files: dict[str, bytes] = {"wnids.txt": "\n".join(wnids).encode() + b"\n",
                               "words.txt": "".join(f"{w}\tthing {i}, other\n" for i, w in enumerate(wnids)).encode()}

    def jpeg() -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(buffer, format="JPEG")
        return buffer.getvalue()

    annotations = []
    for w in wnids:
        files[f"train/{w}/{w}_boxes.txt"] = b""
        for k in range(train_per_class):
            files[f"train/{w}/images/{w}_{k}.JPEG"] = jpeg()
    for k in range(classes * val_per_class):
        files[f"val/images/val_{k}.JPEG"] = jpeg()
        annotations.append(f"val_{k}.JPEG\t{wnids[k % classes]}\t0\t0\t63\t63")
    files["val/val_annotations.txt"] = ("\n".join(annotations) + "\n").encode()
    files["test/images/test_0.JPEG"] = jpeg()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if zipped:
        path = d / "tiny-imagenet-200.zip"
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in files.items():
                zf.writestr(f"tiny-imagenet-200/{name}", data)
        return path
    root = d / "tiny-imagenet-200"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def write_cityscapes(
    directory: str | Path, n_train: int = 4, n_val: int = 2, size: tuple[int, int] = (32, 64), seed: int = 0
) -> Path:
    """A tiny Cityscapes in its official layout: ``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png``
    and ``gtFine/{train,val}/<city>/*_gtFine_labelIds.png`` (random RGB images; label-id masks of
    horizontal bands of road, car, sky, person and void ids); returns ``directory``."""
    from PIL import Image

    d = Path(directory)
    rng = np.random.default_rng(seed)
    h, w = size
    bands = np.array([7, 26, 23, 24, 0], dtype=np.uint8)  # road, car, sky, person, unlabeled (void)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            city = "aachen" if i % 2 == 0 else "bochum"
            stem = f"{city}_{i:06d}_000019"
            for folder in ("leftImg8bit", "gtFine"):
                (d / folder / split / city).mkdir(parents=True, exist_ok=True)
            image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            rows = np.array_split(np.arange(h), len(bands))
            ids = np.empty((h, w), dtype=np.uint8)
            for band, r in zip(np.roll(bands, i), rows):
                ids[r] = band
            Image.fromarray(image).save(d / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png")
            Image.fromarray(ids).save(d / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png")
    return d
