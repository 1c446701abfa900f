"""Finding dataset files on disk and, failing that, downloading them with checksum checks.

Search order: explicit ``data_dir``; ``$FEDTAIL_DATA_DIR``; the system dataset folders
(``/usr/share/datasets/<debian-name>``, e.g. from ``apt-get install dataset-fashion-mnist``);
the user cache ``($XDG_CACHE_HOME or ~/.cache)/fedtail/<name>``. Within each folder the
files may sit directly or in a subfolder named after the dataset.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedtail.errors import DataError

ENV_DATA_DIR = "FEDTAIL_DATA_DIR"
# Set to 1 to forbid any network access (same as download=False everywhere).
ENV_OFFLINE = "FEDTAIL_OFFLINE"
# Module-level so tests (and unusual systems) can point it elsewhere.
SYSTEM_DATA_ROOTS: list[Path] = [Path("/usr/share/datasets")]
DOWNLOAD_TIMEOUT = 60.0

MNIST_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class Resource:
    """One downloadable file and its MD5."""

    filename: str
    url: str
    md5: str


@dataclass(frozen=True)
class Source:
    """Where a file-backed dataset may live and how to recognise and fetch it."""

    name: str
    system_name: str  # folder under the system roots (the Debian package's name)
    subdirs: tuple[str, ...]  # accepted subfolders of any searched folder
    expected: str  # human description of the files, for error messages
    resources: tuple[Resource, ...]
    match: Callable[[Path], Path | None]  # folder -> dataset path if the files are there
    hint: str  # how to obtain the files by hand


def find_idx_file(directory: Path, stem: str) -> Path | None:
    """``stem`` or ``stem.gz`` inside ``directory`` (gzip preferred: it is what is shipped)."""
    for name in (stem + ".gz", stem):
        p = directory / name
        if p.is_file():
            return p
    return None


def _match_idx(directory: Path) -> Path | None:
    return directory if all(find_idx_file(directory, s) for s in MNIST_STEMS) else None


def _cifar_matcher(tarball: str, folder: str, members: tuple[str, ...]) -> Callable[[Path], Path | None]:
    def match(directory: Path) -> Path | None:
        if (directory / tarball).is_file():
            return directory / tarball
        for d in (directory / folder, directory):
            if all((d / m).is_file() for m in members):
                return d
        return None

    return match


def _match_tinyimagenet(directory: Path) -> Path | None:
    if (directory / "tiny-imagenet-200.zip").is_file():
        return directory / "tiny-imagenet-200.zip"
    for d in (directory / "tiny-imagenet-200", directory):
        if (d / "wnids.txt").is_file() and (d / "train").is_dir() and (d / "val" / "val_annotations.txt").is_file():
            return d
    return None


CIFAR10_MEMBERS = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR100_MEMBERS = ("train", "test", "meta")

_FMNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_IDX_EXPECTED = ", ".join(s + "(.gz)" for s in MNIST_STEMS)

SOURCES: dict[str, Source] = {
    "fmnist": Source(
        name="fmnist",
        system_name="fashion-mnist",
        subdirs=("fashion-mnist", "fmnist", "FashionMNIST", "FashionMNIST/raw", "fashion_mnist"),
        expected=_IDX_EXPECTED,
        resources=tuple(
            Resource(s + ".gz", _FMNIST_URL + s + ".gz", md5)
            for s, md5 in zip(
                MNIST_STEMS,
                (
                    "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                    "25c81989df183df01b3e8a0aad5dffbe",
                    "bef4ecab320f06d8554ea6380940ec79",
                    "bb300cfdad3c16e7a12a480ee83cd310",
                ),
            )
        ),
        match=_match_idx,
        hint="run `apt-get install dataset-fashion-mnist` (installs /usr/share/datasets/fashion-mnist) "
        "or put the four files in --data-dir / $FEDTAIL_DATA_DIR",
    ),
    "mnist": Source(
        name="mnist",
        system_name="mnist",
        subdirs=("mnist", "MNIST", "MNIST/raw"),
        expected=_IDX_EXPECTED,
        resources=tuple(
            Resource(s + ".gz", _MNIST_URL + s + ".gz", md5)
            for s, md5 in zip(
                MNIST_STEMS,
                (
                    "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                    "d53e105ee54ea40749a09fcbcd1e9432",
                    "9fb629c4189551a2d022fa330f9573f3",
                    "ec29112dd5afa0611ce80d1b7f02629c",
                ),
            )
        ),
        match=_match_idx,
        hint="put the four MNIST files in --data-dir / $FEDTAIL_DATA_DIR",
    ),
    "cifar10": Source(
        name="cifar10",
        system_name="cifar10",
        subdirs=("cifar10", "cifar-10", "CIFAR10"),
        expected="cifar-10-python.tar.gz or its extracted folder cifar-10-batches-py/ ("
        + ", ".join(CIFAR10_MEMBERS)
        + ")",
        resources=(
            Resource(
                "cifar-10-python.tar.gz",
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
            ),
        ),
        match=_cifar_matcher("cifar-10-python.tar.gz", "cifar-10-batches-py", CIFAR10_MEMBERS),
        hint="put cifar-10-python.tar.gz (or cifar-10-batches-py/) in --data-dir / $FEDTAIL_DATA_DIR",
    ),
    "cifar100": Source(
        name="cifar100",
        system_name="cifar100",
        subdirs=("cifar100", "cifar-100", "CIFAR100"),
        expected="cifar-100-python.tar.gz or its extracted folder cifar-100-python/ (train, test, meta)",
        resources=(
            Resource(
                "cifar-100-python.tar.gz",
                "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                "eb9058c3a382ffc7106e4002c42a8d85",
            ),
        ),
        match=_cifar_matcher("cifar-100-python.tar.gz", "cifar-100-python", CIFAR100_MEMBERS),
        hint="put cifar-100-python.tar.gz (or cifar-100-python/) in --data-dir / $FEDTAIL_DATA_DIR",
    ),
    "tinyimagenet": Source(
        name="tinyimagenet",
        system_name="tiny-imagenet",
        subdirs=("tinyimagenet", "tiny-imagenet", "tiny-imagenet-200"),
        expected="tiny-imagenet-200.zip or its folder tiny-imagenet-200/ (wnids.txt, train/, val/val_annotations.txt)",
        resources=(),  # not downloaded: fetch the official release by hand
        match=_match_tinyimagenet,
        hint="put tiny-imagenet-200.zip (or the extracted tiny-imagenet-200/) in --data-dir / $FEDTAIL_DATA_DIR",
    ),
}


def cache_root() -> Path:
    """``($XDG_CACHE_HOME or ~/.cache)/fedtail``, read at call time so it follows the environment."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedtail"


def search_roots(source: Source, data_dir: str | Path | None = None) -> list[Path]:
    """Folders searched for ``source``, in priority order (without their subfolders)."""
    roots: list[Path] = []
    if data_dir is not None:
        roots.append(Path(data_dir).expanduser())
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        roots.append(Path(env).expanduser())
    roots.extend(Path(r) / source.system_name for r in SYSTEM_DATA_ROOTS)
    roots.append(cache_root() / source.name)
    return roots


def find(source: Source, data_dir: str | Path | None = None) -> Path | None:
    """Path of the dataset files (folder, tarball or extracted folder), or None."""
    for root in search_roots(source, data_dir):
        for d in (root, *(root / s for s in source.subdirs)):
            if d.is_dir():
                found = source.match(d)
                if found is not None:
                    return found
    return None


def md5_file(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_url(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT) -> None:
    """Stream ``url`` into ``dest``. Module-level so tests can replace it (no network in tests)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(dest, "wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)


def download(source: Source, target: Path) -> None:
    """Fetch every resource of ``source`` into ``target``, verified by MD5.

    Each file goes to a temporary name in ``target`` and is renamed only once its checksum
    matches, so an interrupted or bad download never leaves a file that looks valid.
    Raises DataError (network failure or checksum mismatch).
    """
    target.mkdir(parents=True, exist_ok=True)
    for res in source.resources:
        final = target / res.filename
        if final.is_file() and md5_file(final) == res.md5:
            continue
        fd, tmp_name = tempfile.mkstemp(prefix=f".{res.filename}.", suffix=".part", dir=target)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            try:
                fetch_url(res.url, tmp)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise DataError(f"download of {res.url} failed: {reason}") from exc
            got = md5_file(tmp)
            if got != res.md5:
                raise DataError(f"checksum mismatch for {res.url}: md5 {got}, expected {res.md5}")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)


def downloads_allowed(download_flag: bool) -> bool:
    return download_flag and os.environ.get(ENV_OFFLINE, "").strip() not in ("1", "true", "yes")


def locate(name: str, data_dir: str | Path | None = None, download_missing: bool = True) -> Path:
    """Path of dataset ``name``'s files, downloading into the user cache if allowed.

    Raises DataError saying which files were expected, every folder searched and how to get them.
    """
    source = SOURCES[name]
    found = find(source, data_dir)
    if found is not None:
        return found
    roots = search_roots(source, data_dir)
    looked = "; ".join(str(r) for r in roots) + " (each also with subfolders " + ", ".join(source.subdirs) + ")"
    problem = "not found and downloading is disabled"
    if not source.resources:
        problem = "not found (fedtail does not download it)"
    elif downloads_allowed(download_missing):
        try:
            download(source, cache_root() / source.name)
        except DataError as exc:
            problem = f"not found, and {exc}"
        else:
            found = source.match(cache_root() / source.name)
            if found is not None:
                return found
            problem = "downloaded files were not recognised"
    fetch = f", or allow downloading into {cache_root() / source.name}" if source.resources else ""
    raise DataError(
        f"dataset {name!r}: {problem}. Expected {source.expected}. Looked in: {looked}. "
        f"To get them: {source.hint}{fetch}."
    )
