"""Segmentation: metrics against hand-computed confusions, the label tables, fmnist-seg and the
Cityscapes loader on small generated files, --partition semantic, one round of every algorithm
that runs the task, resume and workers, and bad input as one error line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import tiny_raw
from fedtail.algorithms import ALGORITHMS
from fedtail.components import build_config
from fedtail.data import load_dataset
from fedtail.data.base import IGNORE, IGNORE_INDEX
from fedtail.data.fixtures import write_cityscapes, write_idx_dataset
from fedtail.data.segmentation import cityscapes_train_ids, pixel_counts, primary_classes, segmentation_dataset
from fedtail.engine import prepare
from fedtail.engine.training import evaluate
from fedtail.errors import ConfigError, DataError
from fedtail.metrics.segmentation import class_scores, personalized_segmentation, summary
from fedtail.algorithms.federated_features import classifier_inputs
from fedtail.algorithms.mupfl.bavd import activation_modules
from fedtail.models.segmentation import mobilenetv3_small_classifier, mobilenetv3_small_seg, seg_tiny
from helpers import PACKAGED, invoke, run_with_summary, strip_timing
from test_checkpoint import assert_same_run, stopped_and_resumed

SEGMENTATION = sorted(n for n in PACKAGED if "segmentation" in ALGORITHMS[n].tasks)  # fedtail's own, not tests'

OPTIONS = {"size": 16, "train": 120, "test": 40, "scale": [6, 12], "cache": False}


@pytest.fixture(scope="module")
def fmnist_dir(tmp_path_factory):
    return write_idx_dataset(tmp_path_factory.mktemp("fmnist"), 300, 100)


def seg_config(data_dir, **overrides):
    raw = tiny_raw(dataset="fmnist-seg", data_dir=str(data_dir), model="seg-tiny", fraction=0.4, rounds=1)
    raw |= {"dataset_options": OPTIONS, "partition": {"scheme": "semantic", "num_clients": 5, "classes_per_client": 2}}
    return build_config(raw | overrides)


# --- metrics ---------------------------------------------------------------------------------------

def test_miou_and_macc_of_a_hand_computed_confusion_leave_an_absent_class_out():
    # classes 0, 1, background 2; class 1 has no ground truth here, but one pixel predicted as it
    conf = np.array([[3, 1, 0], [0, 0, 0], [2, 0, 4]])
    iou, acc = class_scores(conf)
    assert iou[0] == pytest.approx(3 / 6) and iou[2] == pytest.approx(4 / 6) and np.isnan(iou[1])
    assert acc[0] == pytest.approx(3 / 4) and acc[2] == pytest.approx(4 / 6) and np.isnan(acc[1])
    s = summary(conf)
    assert s["miou"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert s["macc"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert s["pixel_acc"] == pytest.approx(7 / 10)


def test_personalised_means_are_over_clients_and_weighted_ones_over_pixels():
    a = np.array([[3, 1, 0], [0, 0, 0], [2, 0, 4]])
    b = np.array([[0, 0, 0], [0, 5, 5], [0, 0, 10]])
    empty = np.zeros((3, 3), dtype=np.int64)
    m = personalized_segmentation(np.stack([a, b, empty]), ([0], [1], [2]))
    miou_b = (5 / 10 + 10 / 15) / 2
    assert m["personalized_miou"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + miou_b) / 2)  # the client without data left out
    assert m["per_client_miou"][2] is None
    # pooled class by class over the clients whose ground truth holds the class: class 0 from a alone,
    # class 1 from b alone (a's pixel predicted as 1 is a's false negative of 0, not b's false positive
    # of 1: summing a + b would give 5 / 11), the background from both
    pooled_iou = np.array([3 / 6, 5 / 10, 14 / 21])
    pooled_acc = np.array([3 / 4, 5 / 10, 14 / 16])
    assert class_scores(a + b)[0][1] == pytest.approx(5 / 11)
    assert m["per_class_iou"] == pytest.approx(list(pooled_iou))
    assert m["personalized_miou_weighted"] == pytest.approx(pooled_iou.mean())
    assert m["personalized_macc_weighted"] == pytest.approx(pooled_acc.mean())
    assert m["head_iou"] == pytest.approx(pooled_iou[0]) and m["tail_iou"] == pytest.approx(pooled_iou[2])


def test_evaluation_counts_the_confusion_of_the_argmax_over_pixels_not_ignored(fmnist_dir):
    data = load_dataset("fmnist-seg", str(fmnist_dir), **OPTIONS)
    y = data.test.y.clone()
    y[:, :2] = IGNORE  # two ignored rows in every mask
    split = type(data.test)(data.test.x, y, primary=data.test.primary)
    torch.manual_seed(0)
    model = seg_tiny(data.input_shape, data.num_classes)
    table = data.label_table([1, 4])
    counts = evaluate(model, data, split, None, data.num_classes, batch_size=7, labels=table)
    model.eval()
    with torch.no_grad():
        predicted = model(data.normalize(split.x)).argmax(dim=1)
    truth = table[y.long()]
    valid = truth >= 0
    expected = np.zeros((data.num_classes, data.num_classes), dtype=np.int64)
    np.add.at(expected, (truth[valid].numpy(), predicted[valid].numpy()), 1)
    assert np.array_equal(counts.confusion.numpy(), expected)
    assert counts.total.sum() == valid.sum() and np.array_equal(counts.correct.numpy(), np.diag(expected))
    assert set(np.flatnonzero(expected.sum(axis=1))) <= {1, 4, data.background}  # the client's labelling


def test_a_label_table_keeps_a_clients_classes_and_maps_the_rest_to_background(fmnist_dir):
    data = load_dataset("fmnist-seg", str(fmnist_dir), **OPTIONS)
    table = data.label_table([2, 7])
    assert table[2] == 2 and table[7] == 7 and table[IGNORE] == IGNORE_INDEX
    assert all(int(table[c]) == data.background for c in range(data.num_classes) if c not in (2, 7))
    own = data.label_table()
    assert torch.equal(own[: data.num_classes], torch.arange(data.num_classes)) and own[IGNORE] == IGNORE_INDEX
    _, y = data.batch(data.train, torch.arange(5), table)
    assert y.dtype == torch.int64 and set(y.unique().tolist()) <= {2, 7, data.background}


# --- data ------------------------------------------------------------------------------------------

def test_fmnist_seg_is_deterministic_cached_and_labels_each_image_by_a_class_it_shows(fmnist_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a = load_dataset("fmnist-seg", str(fmnist_dir), **(OPTIONS | {"cache": True}))
    assert len(list((tmp_path / "fedtail" / "fmnist-seg").glob("*.npz"))) == 1
    b = load_dataset("fmnist-seg", str(fmnist_dir), **(OPTIONS | {"cache": True}))  # from the cache
    c = load_dataset("fmnist-seg", str(fmnist_dir), **OPTIONS)  # generated again
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, c.train.y) and torch.equal(a.test.y, c.test.y)
    other = load_dataset("fmnist-seg", str(fmnist_dir), **(OPTIONS | {"seed": 1}))
    assert not torch.equal(a.train.y, other.train.y)
    assert a.segmentation and a.num_classes == 11 and a.background == 10 and a.partition_classes == 10
    assert a.train.x.shape == (120, 1, 16, 16) and a.train.y.shape == (120, 16, 16) and a.train.y.dtype == torch.uint8
    shown = [(a.train.y[i] == a.train.primary[i]).any() for i in range(len(a.train))]
    assert all(shown) and int(a.train.primary.max()) < 10
    assert pixel_counts(a.train.y, 11).tolist() == np.bincount(a.train.y.numpy().ravel(), minlength=11).tolist()


def test_the_primary_class_balances_the_classes_an_image_shows_rarer_first():
    masks = torch.full((6, 10, 10), 3, dtype=torch.uint8)  # 3: background
    masks[0, :5] = 0
    masks[0, 5:6] = 1  # 10 % of its pixels
    masks[1, :] = 0
    masks[2, 0, 0] = 2  # 1 pixel, below MIN_SHARE, but the image shows nothing else
    masks[3:, :5], masks[3:, 5:] = 0, 1  # three images that show classes 0 and 1
    frequency = np.array([100, 5, 50])
    # 0: a tie at no images, the rarer class 1; 3: class 0 has 1 image, class 1 has 1: the rarer, 1;
    # 4: class 0 (1 image) before class 1 (2); 5: a tie at 2, the rarer
    assert primary_classes(masks, 3, frequency).tolist() == [1, 0, 2, 1, 0, 1]
    masks[2, 0, 0] = 3
    with pytest.raises(DataError, match="image 2 shows none"):
        primary_classes(masks, 3, frequency)


def test_every_class_of_street_like_scenes_gets_images():
    """Every image shows classes 0-2 (road, sky, buildings) on most of its pixels beside one rarer class."""
    masks = torch.zeros(60, 10, 10, dtype=torch.uint8)
    masks[:, 3:6] = 1
    masks[:, 6:9] = 2
    masks[:, 9] = torch.arange(60).remainder(3).add(3).to(torch.uint8)[:, None]  # one of 3, 4, 5
    frequency = pixel_counts(masks, 6)
    counts = np.bincount(primary_classes(masks, 6, frequency).numpy(), minlength=6)
    assert counts.min() >= 9 and counts.sum() == 60


def test_the_cityscapes_loader_reads_the_official_layout_and_maps_label_ids_to_train_ids(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_cityscapes(tmp_path / "cityscapes", n_train=4, n_val=2, size=(20, 40))
    data = load_dataset("cityscapes", str(tmp_path), height=10, width=20)
    cached = list((tmp_path / "cache" / "fedtail" / "cityscapes-resized").glob("*.npz"))
    assert len(cached) == 1
    again = load_dataset("cityscapes", str(tmp_path), height=10, width=20)  # from the cache
    assert torch.equal(again.train.x, data.train.x) and torch.equal(again.test.y, data.test.y)
    fresh = load_dataset("cityscapes", str(tmp_path), height=10, width=20, cache=False)
    assert torch.equal(fresh.train.y, data.train.y)
    label = sorted((tmp_path / "cityscapes" / "gtFine" / "train").glob("*/*_labelIds.png"))[0]
    Image.fromarray(np.full((20, 40), 7, dtype=np.uint8)).save(label)  # an edited file: all road
    edited = load_dataset("cityscapes", str(tmp_path), height=10, width=20)
    assert len(list(cached[0].parent.glob("*.npz"))) == 2 and not torch.equal(edited.train.y, data.train.y)
    assert data.num_classes == 20 and data.background == 19 and data.class_names[13] == "car"
    assert data.train.x.shape == (4, 3, 10, 20) and data.test.y.shape == (2, 10, 20)
    ids = np.asarray(Image.open(next((tmp_path / "cityscapes" / "gtFine" / "train").glob("*/*_labelIds.png"))))
    assert sorted(np.unique(ids).tolist()) == [0, 7, 23, 24, 26]
    assert sorted(data.train.y.unique().tolist()) == [0, 10, 11, 13, IGNORE]  # road, sky, person, car, void
    table = cityscapes_train_ids()
    assert table[7] == 0 and table[33] == 18 and table[26] == 13 and table[0] == IGNORE and table[9] == IGNORE


def test_missing_cityscapes_folders_are_named(tmp_path):
    (tmp_path / "cityscapes" / "leftImg8bit").mkdir(parents=True)
    with pytest.raises(DataError, match="gtFine/ is missing"):
        load_dataset("cityscapes", str(tmp_path))


def test_masks_with_a_label_outside_the_classes_or_another_size_are_refused():
    x = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)
    y = torch.zeros(2, 4, 4, dtype=torch.uint8)
    names = ("a", "b", "background")
    bad = y.clone()
    bad[0, 0, 0] = 7
    with pytest.raises(DataError, match="mask value 7 is no class"):
        segmentation_dataset("t", (x, bad), (x, y), names, (0.5,), (0.5,))
    with pytest.raises(DataError, match="do not match"):
        segmentation_dataset("t", (x, y[:, :3]), (x, y), names, (0.5,), (0.5,))


def test_cli_reports_bad_cityscapes_files_in_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = write_cityscapes(tmp_path / "cityscapes", n_train=2, n_val=1, size=(20, 40))
    label = next((root / "gtFine" / "train").glob("*/*_labelIds.png"))
    Image.fromarray(np.zeros((10, 10), dtype=np.uint8)).save(label)  # a label of another size
    result = invoke("run", "-a", "fedavg", "--dataset", "cityscapes", "--data-dir", tmp_path, "--model", "seg-tiny",
                    "--partition", "semantic", "--clients", "2", "--rounds", "1", "--out", tmp_path / "run")  # fmt: skip
    assert result.exit_code != 0
    assert "error:" in result.output and "is 40x20 but" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "summary.json").exists()


def test_cli_reports_a_mask_label_outside_the_classes_in_one_error_line(tmp_path, monkeypatch):
    import fedtail.data.segmentation as seg

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_cityscapes(tmp_path / "cityscapes", n_train=2, n_val=1, size=(20, 40))
    table = seg.cityscapes_train_ids()
    table[table == 0] = 50  # road's train id, out of the 20 classes
    monkeypatch.setattr(seg, "cityscapes_train_ids", lambda: table)
    result = invoke("run", "-a", "fedavg", "--dataset", "cityscapes", "--data-dir", tmp_path, "--model", "seg-tiny",
                    "--partition", "semantic", "--clients", "2", "--rounds", "1", "--out", tmp_path / "run")  # fmt: skip
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "mask value 50 is no class" in errors[0], result.output
    assert "Traceback" not in result.output and not (tmp_path / "run" / "summary.json").exists()


# --- partition -------------------------------------------------------------------------------------

def test_semantic_partition_keeps_beta_classes_per_client_and_cuts_head_and_tail_by_pixels(fmnist_dir):
    config = seg_config(fmnist_dir)
    data, part = prepare(config)
    for i, client in enumerate(part.clients):
        assert client.classes.tolist() == [2 * i, 2 * i + 1]
        assert set(data.train.labels[client.train]) <= set(client.classes.tolist())
    summary = part.summary()
    assert summary["clients"][1]["classes"] == [2, 3]
    pixels = pixel_counts(data.train.y[part.kept], 11)[:10]
    assert summary["global_train_pixel_counts"] == pixels.tolist()
    head, _, tail = part.class_frequency_groups()
    assert min(pixels[head]) >= max(pixels[tail])


def test_cli_partition_semantic_writes_and_prints_each_clients_classes(fmnist_dir, tmp_path):
    out = tmp_path / "part.json"
    result = invoke("partition", "--dataset", "fmnist-seg", "--data-dir", fmnist_dir, "--set", "model=seg-tiny",
                    "--partition", "semantic", "--clients", "5", "--classes-per-client", "2", "--imbalance", "10",
                    "--set", "dataset_options.size=16", "--set", "dataset_options.train=120",
                    "--set", "dataset_options.test=40", "--set", "dataset_options.scale=[6,12]",
                    "--set", "dataset_options.cache=false", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert [c["classes"] for c in summary["clients"]] == [[2 * k, 2 * k + 1] for k in range(5)]
    assert "0: 0,1; 1: 2,3; 2: 4,5; 3: 6,7; 4: 8,9" in result.output
    pixels = summary["global_train_pixel_counts"]
    assert f"training pixels per class (the long tail, background left out): {', '.join(map(str, pixels))}" in result.output
    assert pixels[0] > pixels[-1]  # IF 10 on top: the head class has more pixels than the tail
    assert out.with_suffix(".png").stat().st_size > 1000


def test_semantic_partition_needs_a_segmentation_dataset_and_a_matching_model(fmnist_dir):
    with pytest.raises(ConfigError, match="classification dataset"):
        prepare(build_config(tiny_raw(partition={"scheme": "semantic", "num_clients": 3, "classes_per_client": 1})))
    with pytest.raises(ConfigError, match="use a segmentation model"):
        prepare(seg_config(fmnist_dir, model="cnn-fmnist"))
    with pytest.raises(ConfigError, match="use a classifier"):
        prepare(build_config(tiny_raw() | {"dataset": "digits", "dataset_options": {}, "model": "seg-tiny"}))


def test_settings_of_the_other_task_are_refused_before_the_run(fmnist_dir):
    with pytest.raises(ConfigError, match="--class-probabilities .* is for classification"):
        prepare(seg_config(fmnist_dir, class_probabilities=True))
    with pytest.raises(ConfigError, match="--sample-masks writes predicted masks of a segmentation run"):
        prepare(build_config(tiny_raw(sample_masks=2)))


def test_similarity_rounds_of_a_segmentation_run_use_the_primary_classes(fmnist_dir):
    _, rows, sim = run_with_summary(seg_config(fmnist_dir, algorithm="fedac", rounds=1, similarity_rounds=[1]))
    logged = rows[-1]["client_similarity"]
    assert logged["clients"] == [0, 1, 2, 3, 4] and len(logged["kl"]) == 5


def test_data_info_describes_a_segmentation_dataset(fmnist_dir, capsys, monkeypatch, tmp_path):
    from fedtail.data.__main__ import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["info", "fmnist-seg", "--data-dir", str(fmnist_dir)]) == 0
    out = capsys.readouterr().out
    assert "segmentation, background class 10" in out and "images by primary class" in out


# --- models ----------------------------------------------------------------------------------------

def test_mobilenetv3_small_has_the_published_parameter_count_and_a_per_pixel_head():
    assert sum(p.numel() for p in mobilenetv3_small_classifier().parameters()) == 2_542_856
    model = mobilenetv3_small_seg((3, 64, 96), 20)
    assert model(torch.zeros(2, 3, 64, 96)).shape == (2, 20, 64, 96)
    assert isinstance(model.classifier, torch.nn.Linear) and model.classifier.out_features == 20
    assert model.head_keys() == model.classifier_keys() == ["head.0.linear.weight", "head.0.linear.bias"]
    assert model.features(torch.zeros(1, 3, 64, 96)).shape == (1, 128 + 24, 8, 12)  # stride 8
    half = mobilenetv3_small_seg((3, 64, 96), 20, width=0.5)
    assert sum(p.numel() for p in half.parameters()) < sum(p.numel() for p in model.parameters()) / 2


def test_the_per_pixel_classifiers_inputs_are_what_the_full_forward_hands_it():
    model = mobilenetv3_small_seg((3, 32, 48), 20).eval()
    captured = []
    handle = model.classifier.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        model(x)
        h = classifier_inputs(model, x)
    handle.remove()
    assert h.shape == (2, 4, 6, 152) and torch.equal(h, captured[0])


def test_bavd_can_sit_after_every_activation_of_mobilenetv3_and_its_last_is_lr_aspps_branch():
    model = mobilenetv3_small_seg((3, 64, 96), 20)
    layers = activation_modules(model.body)
    assert sum(isinstance(m, torch.nn.Hardswish) for m in layers) == 18  # the stem, 8 blocks x 2, the last 1x1
    assert layers[-1] is model.body.cbr[-1]  # forward order: the last activation before the classifier


# --- every algorithm of the task -------------------------------------------------------------------

def test_the_algorithms_of_the_task_are_the_expected_ones():
    assert {"fedavg", "fedprox", "fednova", "ditto", "fedrep", "creff", "mupfl"} <= set(SEGMENTATION)
    for name in PACKAGED:
        spec = ALGORITHMS[name]
        assert ("segmentation" in spec.tasks) != ("segmentation" in spec.why_not), name


@pytest.mark.parametrize("name", SEGMENTATION)
def test_one_round_of_each_algorithm_that_runs_segmentation(fmnist_dir, name):
    extra = {"edges": 2} if name == "mupfl" else {}
    summary, rows, _ = run_with_summary(seg_config(fmnist_dir, algorithm=name, **extra))
    final = summary["final"]
    assert 0.0 <= final["personalized_miou"] <= 1.0 and 0.0 <= final["personalized_acc"] <= 1.0
    assert len(rows[-1]["per_client_miou"]) == 5 and len(rows[-1]["per_class_iou"]) == 11
    assert np.isfinite(final["train_loss"])


def test_mupfl_with_bavd_and_creff_match_per_pixel_features(fmnist_dir):
    summary, _, sim = run_with_summary(seg_config(fmnist_dir, algorithm="mupfl", edges=2, rounds=2,
                                                  options={"bavd": True}))  # fmt: skip
    assert summary["final"]["personalized_miou"] is not None
    trained = [state for _, state in sim.client_state.items() if "bavd" in state]
    assert trained and sim.server.matched  # BAVD kept maps of the body's activations; PKCF matched features
    summary, _, sim = run_with_summary(seg_config(fmnist_dir, algorithm="creff", rounds=2))
    assert summary["final"]["global_miou"] is not None and sim.server.features.features.shape[-1] == 64


@pytest.mark.parametrize("name", sorted(set(PACKAGED) - set(SEGMENTATION)))
def test_the_other_algorithms_say_why_not(fmnist_dir, name):
    with pytest.raises(ConfigError, match=f"{name} does not run segmentation"):
        prepare(seg_config(fmnist_dir, algorithm=name))


@pytest.mark.parametrize("name", ["fedavg", "ditto", "mupfl"])
def test_segmentation_runs_resume_bit_identically(fmnist_dir, name):
    extra = {"edges": 2} if name == "mupfl" else {}
    assert_same_run(*stopped_and_resumed(seg_config(fmnist_dir, algorithm=name, rounds=4, checkpoint_every=2, **extra)))


def test_two_workers_give_the_serial_rows(fmnist_dir):
    config = seg_config(fmnist_dir, algorithm="fedrep", rounds=2)
    _, serial, _ = run_with_summary(config)
    _, parallel, _ = run_with_summary(config.model_copy(update={"workers": 2}))
    assert strip_timing(serial) == strip_timing(parallel)


def test_cli_run_writes_the_segmentation_metrics_by_name(fmnist_dir, tmp_path):
    out = tmp_path / "run"
    result = invoke("run", "-a", "fedavg", "--dataset", "fmnist-seg", "--data-dir", fmnist_dir, "--model", "seg-tiny",
                    "--partition", "semantic", "--clients", "5", "--classes-per-client", "2", "--rounds", "1",
                    "--set", "dataset_options.size=16", "--set", "dataset_options.train=120",
                    "--set", "dataset_options.test=40", "--set", "dataset_options.scale=[6,12]",
                    "--set", "dataset_options.cache=false", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pers. mIoU" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert {"personalized_miou", "personalized_macc", "global_miou", "head_iou"} <= set(summary["final"])
    part = json.loads((out / "partition.json").read_text())
    assert part["clients"][0]["classes"] == [0, 1]


def test_sampled_masks_are_written_and_the_report_draws_them_beside_a_segmentation_table(fmnist_dir, tmp_path):
    from fedtail.runner import MASKS, run_to_folder

    root = tmp_path / "runs"
    for name in ("fedavg", "fedrep"):
        run_to_folder(seg_config(fmnist_dir, algorithm=name, rounds=2, sample_masks=2), root / "s" / name / "seed0")
    with np.load(root / "s" / "fedavg" / "seed0" / MASKS) as z:
        masks = {k: z[k] for k in z.files}
    assert masks["clients"].tolist() == [0, 1, 2, 3, 4]
    assert masks["images"].shape == (5, 2, 1, 16, 16) and masks["predicted"].shape == (5, 2, 16, 16)
    assert set(np.unique(masks["truth"][0])) <= {0, 1, 10, IGNORE_INDEX}  # client 0's labelling
    data, part = prepare(seg_config(fmnist_dir))
    assert masks["index"][0].tolist() == part.clients[0].test[:2].tolist()
    assert np.array_equal(masks["images"][0, :, 0], data.test.x[part.clients[0].test[:2], 0].numpy())
    md = tmp_path / "R.md"
    result = invoke("report", root, "--out", md)
    assert result.exit_code == 0, result.output
    text = md.read_text()
    assert "segmentation metrics" in text and "s mIoU" in text and "](R-masks-s.png)" in text
    # every value by name, the global view of the run with a global model, and the per-class IoU by class name
    assert "Final-round segmentation metrics by name" in text
    assert "| setting | method | seeds | pixel acc | mIoU | pooled mIoU | mAcc | pooled mAcc | head IoU |" in text
    by_name = text.split("Final-round segmentation metrics by name")[1].split("Per-class IoU")[0]
    assert sum(line.startswith("| s | fedavg | 1 |") for line in by_name.splitlines()) == 2  # personalised, global
    assert "| setting | method | seeds | pixel acc | mIoU | mAcc | head IoU | middle IoU | tail IoU |" in by_name
    assert "| setting | method | seeds | T-shirt/top | Trouser |" in text and "| background |" in text
    fedavg = json.loads((root / "s" / "fedavg" / "seed0" / "summary.json").read_text())
    per_class = [row for row in map(json.loads, (root / "s" / "fedavg" / "seed0" / "metrics.jsonl").read_text().splitlines())
                 if "per_class_iou" in row][-1]["per_class_iou"]
    row = next(line for line in text.split("Per-class IoU")[1].splitlines() if line.startswith("| s | fedavg |"))
    shown = [c.strip() for c in row.strip("|").split("|")][3:]
    assert len(shown) == len(per_class) == 11
    for value, cell in zip(per_class, shown):
        assert cell == ("—" if value is None else f"{100 * value:.2f}")
    # rounds to the targets count the mIoU (pixel accuracy is mostly background): a target between
    # the two is reached by the pixel accuracy and not by the mIoU
    assert fedavg["rounds_to_key"] == "personalized_miou"
    rows = [r for r in map(json.loads, (root / "s" / "fedavg" / "seed0" / "metrics.jsonl").read_text().splitlines())
            if "personalized_miou" in r]
    between = (max(r["personalized_miou"] for r in rows) + max(r["personalized_acc"] for r in rows)) / 2
    assert max(r["personalized_miou"] for r in rows) < between < max(r["personalized_acc"] for r in rows)
    low, between = round(min(r["personalized_miou"] for r in rows) / 2, 3), round(between, 3)
    run_to_folder(seg_config(fmnist_dir, algorithm="fedavg", rounds=2, targets=[low, between]), tmp_path / "t")
    reached = json.loads((tmp_path / "t" / "summary.json").read_text())["rounds_to_accuracy"]
    assert list(reached.values()) == [rows[0]["round"], None], reached  # the targets in order
    assert (tmp_path / "R-masks-s.png").stat().st_size > 5000
    assert "Personalised mIoU per round" in text
    assert not (root / "s" / "fedavg" / "seed0" / MASKS).with_name("masks.npz.tmp.npz").exists()


def test_the_mask_figure_spans_head_to_tail_classes_when_the_client_list_wraps():
    from fedtail.report.blocks import head_to_tail
    from fedtail.report.plots import spread

    # Table III's split: 20 clients at β 1 over 10 classes, client k keeps class k mod 10; the long
    # tail makes class 0 the head. Spread over client ids, the picks 0, 6, 13, 19 hold classes
    # 0, 6, 3, 9: not head to tail. Ordered by class, they are.
    kept = [[k % 10] for k in range(20)]
    pixels = [1000 // (c + 1) for c in range(10)]
    assert spread(20, 4) == [0, 6, 13, 19]
    order = head_to_tail(list(range(20)), kept, pixels)
    assert order == list(range(10))  # one client per class, the first that keeps it, head first
    assert [kept[order[j]][0] for j in spread(len(order), 4)] == [0, 3, 6, 9]
    pixels[5] = 5000  # another head: it comes first
    assert head_to_tail(list(range(20)), kept, pixels)[0] == 5
    assert head_to_tail([3, 1], [[], [4], [], [2]], [1, 1, 9, 1, 3]) == [0, 1]  # positions, not ids
    assert head_to_tail([0], [[]], [1]) is None


def test_a_segmentation_run_on_flower_gives_the_simulators_rows_and_masks(fmnist_dir, tmp_path):
    from fedtail.flower.inprocess import InProcessGrid
    from fedtail.flower.server import serve
    from fedtail.runner import MASKS, run_to_folder
    from test_flower_adapter import nodes, rows_of, run_config

    config = seg_config(fmnist_dir, algorithm="fedrep", rounds=2, sample_masks=1, checkpoint_every=0)
    run_to_folder(config, tmp_path / "sim")
    grid = InProcessGrid(nodes(tmp_path, {"clients": "0,2"}, {"clients": "1,3,4"}), rc := run_config(config, tmp_path / "run"))
    serve(grid, rc)
    assert strip_timing(rows_of(tmp_path / "run")) == strip_timing(rows_of(tmp_path / "sim"))
    with np.load(tmp_path / "sim" / MASKS) as a, np.load(tmp_path / "run" / MASKS) as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
