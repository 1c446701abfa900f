"""Tests for fedtail.data: formats, locating, downloading (simulated), generated datasets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import fedtail.data.locate as locate_mod
from fedtail.data import DATASETS, Dataset, Split, load_dataset, read_idx, write_idx
from fedtail.data.__main__ import main as cli_main
from fedtail.data.fixtures import write_cifar_folder, write_cifar_tarball, write_idx_dataset
from fedtail.errors import ConfigError, DataError

REAL_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No env dir, an empty cache and no system roots, so only what a test writes is found."""
    monkeypatch.delenv("FEDTAIL_DATA_DIR", raising=False)
    monkeypatch.delenv("FEDTAIL_OFFLINE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(locate_mod, "SYSTEM_DATA_ROOTS", [tmp_path / "system"])

    def no_network(url: str, dest: Path, timeout: float = 0) -> None:
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(locate_mod, "fetch_url", no_network)
    return tmp_path


# ---------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path: Path, gz: bool) -> None:
    arr = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    p = write_idx(tmp_path / ("a.gz" if gz else "a"), arr, gz=gz)
    assert (p.read_bytes()[:2] == b"\x1f\x8b") == gz
    out = read_idx(p, ndim=3)
    assert out.dtype == np.uint8 and out.flags.writeable
    np.testing.assert_array_equal(out, arr)
    ints = np.arange(-3, 3, dtype=np.int32)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "i", ints)), ints)


def test_idx_gzip_detected_by_content(tmp_path: Path) -> None:
    arr = np.arange(10, dtype=np.uint8)
    p = write_idx(tmp_path / "labels-no-suffix", arr, gz=True)
    np.testing.assert_array_equal(read_idx(p), arr)


def test_idx_truncated_names_path(tmp_path: Path) -> None:
    p = write_idx(tmp_path / "img", np.zeros((4, 28, 28), np.uint8), gz=False)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"img.*truncated or corrupt"):
        read_idx(p)


def test_idx_bad_magic_and_dims(tmp_path: Path) -> None:
    p = tmp_path / "junk"
    p.write_bytes(b"hello world, not idx")
    with pytest.raises(DataError, match="junk.*not an IDX file"):
        read_idx(p)
    q = write_idx(tmp_path / "lab", np.zeros(3, np.uint8))
    with pytest.raises(DataError, match="lab has 1 dimensions, expected 3"):
        read_idx(q, ndim=3)


def test_idx_truncated_gzip(tmp_path: Path) -> None:
    p = write_idx(tmp_path / "x.gz", np.arange(5000, dtype=np.int32), gz=True)
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(DataError, match=r"x\.gz"):
        read_idx(p)
    fake = tmp_path / "y.gz"
    fake.write_bytes(b"plain bytes")
    with pytest.raises(DataError, match=r"y\.gz.*not gzip"):
        read_idx(fake)


# ---------------------------------------------------------------- MNIST-format datasets


@pytest.mark.parametrize("gz", [True, False])
def test_fmnist_from_data_dir(isolated: Path, gz: bool) -> None:
    d = write_idx_dataset(isolated / "dd", 30, 12, gz=gz)
    ds = load_dataset("fmnist", data_dir=d, download=False)
    assert (len(ds.train), len(ds.test)) == (30, 12)
    assert ds.train.x.shape == (30, 1, 28, 28) and ds.train.x.dtype == torch.uint8
    assert ds.train.y.dtype == torch.int64 and ds.num_classes == 10
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[-1] == "Ankle boot"
    assert ds.mean == (0.2860,) and ds.std == (0.3530,)
    raw = read_idx(d / ("train-images-idx3-ubyte" + (".gz" if gz else "")))
    np.testing.assert_array_equal(ds.train.x[:, 0].numpy(), raw)


@pytest.mark.parametrize("sub", ["fashion-mnist", "fmnist", "FashionMNIST/raw"])
def test_fmnist_subfolders_and_env(isolated: Path, monkeypatch: pytest.MonkeyPatch, sub: str) -> None:
    root = isolated / "envroot"
    write_idx_dataset(root / sub, 10, 10)
    monkeypatch.setenv("FEDTAIL_DATA_DIR", str(root))
    assert len(load_dataset("fmnist", download=False).train) == 10


def test_system_and_cache_locations(isolated: Path) -> None:
    write_idx_dataset(isolated / "system" / "mnist", 7, 3)
    ds = load_dataset("mnist", download=False)
    assert len(ds.train) == 7 and ds.mean == (0.1307,) and ds.class_names[3] == "3"
    write_idx_dataset(isolated / "cache" / "fedtail" / "fmnist", 5, 4)
    assert len(load_dataset("fmnist", download=False).test) == 4


def test_data_dir_wins_over_env(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_idx_dataset(isolated / "a", 11, 2)
    write_idx_dataset(isolated / "b", 22, 2)
    monkeypatch.setenv("FEDTAIL_DATA_DIR", str(isolated / "b"))
    assert len(load_dataset("fmnist", data_dir=isolated / "a", download=False).train) == 11
    assert len(load_dataset("fmnist", download=False).train) == 22


def test_missing_files_lists_where_it_looked(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDTAIL_DATA_DIR", str(isolated / "env"))
    with pytest.raises(DataError) as err:
        load_dataset("fmnist", data_dir=isolated / "mine", download=False)
    msg = str(err.value)
    assert "\n" not in msg
    for where in ("mine", "env", str(isolated / "system" / "fashion-mnist"), str(isolated / "cache" / "fedtail")):
        assert where in msg
    assert "train-images-idx3-ubyte" in msg and "apt-get install dataset-fashion-mnist" in msg


def test_corrupt_file_in_dataset_names_path(isolated: Path) -> None:
    d = write_idx_dataset(isolated / "dd", 10, 5, gz=False)
    p = d / "t10k-labels-idx1-ubyte"
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load_dataset("fmnist", data_dir=d, download=False)


def test_label_count_mismatch(isolated: Path) -> None:
    d = write_idx_dataset(isolated / "dd", 10, 5)
    write_idx(d / "train-labels-idx1-ubyte.gz", np.zeros(9, np.uint8))
    with pytest.raises(DataError, match="10 images but .* 9 labels"):
        load_dataset("fmnist", data_dir=d, download=False)


# ---------------------------------------------------------------- downloads (simulated)


def test_download_checksum_mismatch_leaves_no_file(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def bad_fetch(url: str, dest: Path, timeout: float = 0) -> None:
        calls.append(url)
        Path(dest).write_bytes(b"not the real file")

    monkeypatch.setattr(locate_mod, "fetch_url", bad_fetch)
    with pytest.raises(DataError) as err:
        load_dataset("fmnist", download=True)
    msg = str(err.value)
    assert "checksum mismatch" in msg and "train-images-idx3-ubyte.gz" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert calls and calls[0].startswith("http")
    cache = isolated / "cache" / "fedtail" / "fmnist"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_download_network_failure(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, dest: Path, timeout: float = 0) -> None:
        raise OSError("network unreachable")

    monkeypatch.setattr(locate_mod, "fetch_url", offline)
    with pytest.raises(DataError, match="download of .*cifar-10-python.tar.gz failed: network unreachable"):
        load_dataset("cifar10")
    assert list((isolated / "cache" / "fedtail" / "cifar10").iterdir()) == []


def test_download_success_renames_after_checksum(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Serve fixture files and pretend their MD5s are the official ones.
    src = write_idx_dataset(isolated / "server", 6, 3)
    resources = tuple(
        locate_mod.Resource(r.filename, "fake://" + r.filename, locate_mod.md5_file(src / r.filename))
        for r in locate_mod.SOURCES["fmnist"].resources
    )
    monkeypatch.setitem(
        locate_mod.SOURCES, "fmnist", dataclasses.replace(locate_mod.SOURCES["fmnist"], resources=resources)
    )

    def serve(url: str, dest: Path, timeout: float = 0) -> None:
        Path(dest).write_bytes((src / url.removeprefix("fake://")).read_bytes())

    monkeypatch.setattr(locate_mod, "fetch_url", serve)
    ds = load_dataset("fmnist")
    assert len(ds.train) == 6
    cache = isolated / "cache" / "fedtail" / "fmnist"
    assert sorted(p.name for p in cache.iterdir()) == sorted(r.filename for r in resources)


def test_offline_env_disables_download(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDTAIL_OFFLINE", "1")
    with pytest.raises(DataError, match="downloading is disabled"):
        load_dataset("mnist")  # the no_network fetch would fail the test if called


# ---------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("classes", [10, 100])
@pytest.mark.parametrize("layout", ["tarball", "folder"])
def test_cifar(isolated: Path, classes: int, layout: str) -> None:
    d = isolated / "dd"
    d.mkdir()
    if layout == "tarball":
        write_cifar_tarball(d, 23, 7, classes=classes)
    else:
        write_cifar_folder(d, 23, 7, classes=classes)
    name = f"cifar{classes}"
    ds = load_dataset(name, data_dir=d, download=False)
    assert ds.name == name and ds.num_classes == classes and ds.input_shape == (3, 32, 32)
    assert ds.train.x.shape == (23, 3, 32, 32) and ds.train.x.dtype == torch.uint8
    assert ds.test.x.shape == (7, 3, 32, 32) and ds.test.y.dtype == torch.int64
    assert len(ds.class_names) == classes
    assert int(ds.train.y.max()) < classes
    expected_mean = (0.4914, 0.4822, 0.4465) if classes == 10 else (0.5071, 0.4865, 0.4409)
    assert ds.mean == expected_mean
    if classes == 10:
        assert ds.class_names[0] == "airplane"
        assert set(ds.train.labels.tolist()) == set(range(10))


def test_cifar_pixel_layout(isolated: Path) -> None:
    # Row r of the pickle is [R plane | G plane | B plane], each 32x32 row-major.
    import pickle

    folder = write_cifar_folder(isolated, 5, 2, classes=100)
    blob = pickle.loads((folder / "train").read_bytes(), encoding="bytes")
    ds = load_dataset("cifar100", data_dir=isolated, download=False)
    np.testing.assert_array_equal(ds.train.x[2, 1].numpy(), blob[b"data"][2, 1024:2048].reshape(32, 32))
    assert ds.train.y.tolist() == blob[b"fine_labels"]


def test_cifar_corrupt_tarball(isolated: Path) -> None:
    p = write_cifar_tarball(isolated / "cifar-10-python.tar.gz", 10, 2)
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        load_dataset("cifar10", data_dir=isolated, download=False)


def test_cifar_refuses_foreign_pickle(isolated: Path) -> None:
    import pickle

    folder = write_cifar_folder(isolated, 5, 2, classes=10)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Path("/x"), b"labels": []}))
    with pytest.raises(DataError, match="test_batch.*not allowed"):
        load_dataset("cifar10", data_dir=isolated, download=False)


def test_cifar_python2_pickle() -> None:
    """The official files are Python 2 / numpy 1 pickles: str opcodes, numpy.core globals."""
    import warnings

    from fedtail.data.cifar import _unpickle

    def sbs(b: bytes) -> bytes:  # SHORT_BINSTRING, what Python 2 wrote for str
        return b"U" + bytes([len(b)]) + b

    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + sbs(b"b") + b"\x87R("
        b"K\x01K\x02K\x03\x86cnumpy\ndtype\n" + sbs(b"u1") + b"K\x00K\x01\x87R(K\x03" + sbs(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89" + sbs(bytes(range(6))) + b"tb"
    )
    stream = b"\x80\x02}(" + sbs(b"data") + array + sbs(b"labels") + b"]K\x01au."
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy 2 deprecates numpy.core: we must remap it silently
        blob = _unpickle(stream, "py2")
    assert blob[b"labels"] == [1]
    np.testing.assert_array_equal(blob[b"data"], np.arange(6, dtype=np.uint8).reshape(2, 3))


# ---------------------------------------------------------------- generated datasets


def test_synthetic_shapes_and_determinism() -> None:
    a = load_dataset("synthetic", num_classes=4, dim=6, train_per_class=20, test_per_class=5, seed=3)
    b = load_dataset("synthetic", num_classes=4, dim=6, train_per_class=20, test_per_class=5, seed=3)
    c = load_dataset("synthetic", num_classes=4, dim=6, train_per_class=20, test_per_class=5, seed=4)
    assert a.train.x.shape == (80, 6) and a.test.x.shape == (20, 6) and a.input_shape == (6,)
    assert a.train.x.dtype == torch.float32 and a.num_classes == 4
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert not torch.equal(a.train.x, c.train.x)
    assert np.bincount(a.train.labels).tolist() == [20] * 4
    # mean 0 / std 1: normalize is the identity on float features and must not alias its input.
    x = a.train.x[:10]
    out = a.normalize(x)
    assert torch.allclose(out, x) and out.data_ptr() != x.data_ptr()
    xb, yb = a.batch(a.train, torch.tensor([0, 5]))
    assert torch.equal(xb, a.train.x[[0, 5]]) and torch.equal(yb, a.train.y[[0, 5]])


def test_synthetic_defaults_and_separability() -> None:
    ds = load_dataset("synthetic")
    assert (len(ds.train), len(ds.test), ds.input_shape, ds.num_classes) == (5000, 1000, (32,), 10)
    # Nearest class mean should beat chance by far at separation 3.
    means = torch.stack([ds.train.x[ds.train.y == k].mean(0) for k in range(10)])
    pred = torch.cdist(ds.test.x, means).argmin(1)
    assert (pred == ds.test.y).float().mean() > 0.8


def test_synthetic_bad_option() -> None:
    with pytest.raises(ConfigError, match="dim"):
        load_dataset("synthetic", dim=0)
    with pytest.raises(ConfigError, match="bad options"):
        load_dataset("synthetic", colour="red")


def test_digits() -> None:
    ds = load_dataset("digits")
    assert ds.train.x.shape[1:] == (1, 8, 8) and ds.train.x.dtype == torch.uint8
    assert len(ds.train) + len(ds.test) == 1797 and abs(len(ds.test) - 360) <= 1
    assert int(ds.train.x.max()) == 255 and ds.num_classes == 10
    scaled = ds.train.x.float() / 255
    assert abs(ds.mean[0] - scaled.mean().item()) < 1e-3 and abs(ds.std[0] - scaled.std().item()) < 1e-3
    again = load_dataset("digits")
    assert torch.equal(ds.test.x, again.test.x)
    tr, te = np.bincount(ds.train.labels), np.bincount(ds.test.labels)
    assert np.all(np.abs(tr / tr.sum() - te / te.sum()) < 0.02)  # stratified


# ---------------------------------------------------------------- base / registry / cli


def test_batch_normalisation_values() -> None:
    x = torch.tensor([[[[0, 255]]], [[[255, 0]]]], dtype=torch.uint8)  # (2, 1, 1, 2)
    y = torch.tensor([0, 1])
    ds = Dataset("t", Split(x, y), Split(x, y), 2, (1, 1, 2), (0.2860,), (0.3530,))
    xb, yb = ds.batch(ds.train, torch.tensor([0]))
    assert xb.dtype == torch.float32 and yb.tolist() == [0]
    assert torch.allclose(xb[0, 0, 0], torch.tensor([(0 - 0.2860) / 0.3530, (1 - 0.2860) / 0.3530]))
    rgb = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    split = Split(rgb, torch.zeros(1, dtype=torch.int64))
    ds3 = Dataset("c", split, split, 1, (3, 2, 2), mean, std)
    out = ds3.normalize(rgb)
    for c in range(3):
        assert torch.allclose(out[0, c], torch.full((2, 2), (1 - mean[c]) / std[c]))
    assert rgb.dtype == torch.uint8 and int(rgb[0, 0, 0, 0]) == 255


def test_dataset_rejects_bad_constants() -> None:
    s = Split(torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError):
        Dataset("t", s, s, 1, (2,), (0.0, 0.0), (1.0,))


def test_unknown_name() -> None:
    with pytest.raises(ConfigError) as err:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(err.value)
    assert set(DATASETS) == {"fmnist", "mnist", "cifar10", "cifar100", "tinyimagenet", "synthetic", "digits",
                             "fmnist-seg", "cityscapes"}
    assert all(isinstance(v, str) and v for v in DATASETS.values())


def test_cli_ensure_and_info(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = write_idx_dataset(isolated / "dd", 8, 4)
    assert cli_main(["ensure", "fmnist", "--data-dir", str(d), "--no-download"]) == 0
    assert capsys.readouterr().out.strip() == str(d)
    assert cli_main(["ensure", "cifar10", "--no-download"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "cifar-10-python.tar.gz" in err
    assert cli_main(["info", "fmnist", "--data-dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "8 / 4" in out and "Ankle boot" in out
    assert cli_main(["info", "nope"]) == 2


@pytest.mark.skipif(not REAL_FMNIST.is_dir(), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDTAIL_DATA_DIR", raising=False)
    ds = load_dataset("fmnist", data_dir=REAL_FMNIST, download=False)
    assert (len(ds.train), len(ds.test), ds.num_classes) == (60000, 10000, 10)
    assert ds.train.x.shape == (60000, 1, 28, 28)
    assert np.bincount(ds.test.labels).tolist() == [1000] * 10
    x, _ = ds.batch(ds.train, torch.arange(0, 60000, 7))
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05


@pytest.mark.parametrize("zipped", [False, True])
def test_tinyimagenet_from_the_official_layout(isolated: Path, zipped: bool) -> None:
    from fedtail.data.fixtures import write_tinyimagenet

    write_tinyimagenet(isolated / "data", classes=3, train_per_class=4, val_per_class=2, zipped=zipped)
    ds = load_dataset("tiny-imagenet", data_dir=isolated / "data", download=False)
    assert ds.name == "tinyimagenet" and ds.num_classes == 3 and ds.input_shape == (3, 64, 64)
    assert ds.train.x.shape == (12, 3, 64, 64) and ds.train.x.dtype == torch.uint8
    assert ds.train.y.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # wnids.txt's order is the label order
    assert len(ds.test) == 6 and sorted(ds.test.y.tolist()) == [0, 0, 1, 1, 2, 2]  # the labelled val images
    assert ds.class_names == ("thing 0", "thing 1", "thing 2")
    from PIL import Image  # the pixels are the files' (JPEG-decoded, as RGB, channels first)

    root = isolated / "data" / "tiny-imagenet-200"
    if not zipped:
        first = np.asarray(Image.open(root / "train" / "n00001000" / "images" / "n00001000_0.JPEG").convert("RGB"))
        assert np.array_equal(ds.train.x[0].numpy(), first.transpose(2, 0, 1))


def test_tinyimagenet_missing_or_broken_is_a_clear_error(isolated: Path) -> None:
    from fedtail.data.fixtures import write_tinyimagenet

    with pytest.raises(DataError, match="'tinyimagenet': not found \\(fedtail does not download it\\).*tiny-imagenet-200.zip"):
        load_dataset("tinyimagenet", download=True)
    root = write_tinyimagenet(isolated / "data", classes=2)
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99999999\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="n99999999.*not in wnids.txt"):
        load_dataset("tinyimagenet", data_dir=isolated / "data", download=False)
    write_tinyimagenet(isolated / "data2", classes=2)
    (isolated / "data2" / "tiny-imagenet-200" / "train" / "n00001000" / "images" / "n00001000_1.JPEG").write_bytes(b"no jpeg")
    with pytest.raises(DataError, match="cannot decode train/n00001000/images/n00001000_1.JPEG"):
        load_dataset("tinyimagenet", data_dir=isolated / "data2", download=False)
