"""Tests for fedtail.partition on synthetic label arrays (no dataset downloads)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from fedtail.errors import ConfigError
from fedtail.partition import (
    SCHEMES,
    Partition,
    PartitionConfig,
    dominant_label_sets,
    make_partition,
    plot_heatmap,
)
from fedtail.partition.local_test import allocate, sampled_counts


def _labels(num_classes: int, per_class: int, seed: int) -> np.ndarray:
    # Shuffled so that index order says nothing about the label.
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


@pytest.fixture(scope="module")
def c10() -> tuple[np.ndarray, np.ndarray]:
    return _labels(10, 600, 1), _labels(10, 100, 2)


@pytest.fixture(scope="module")
def c100() -> tuple[np.ndarray, np.ndarray]:
    return _labels(100, 500, 3), _labels(100, 100, 4)


def _cfg(**kw) -> PartitionConfig:
    return PartitionConfig(**kw)


def check_integrity(p: Partition, train_labels: np.ndarray, test_labels: np.ndarray,
                    whole_pool: bool) -> None:
    """No index used twice; everything drawn from the kept pool; counts add up."""
    kept = set(p.kept.tolist())
    owned = []  # every train-split index a client owns: train, val and (holdout) test
    for cl in p.clients:
        for arr in (cl.train, cl.test, cl.val):
            assert arr.dtype == np.int64
        assert len(cl.train) > 0
        parts = [cl.train, cl.val] + ([cl.test] if p.test_source == "train" else [])
        client_idx = np.concatenate(parts)
        assert len(np.unique(client_idx)) == len(client_idx), "train/val/holdout overlap within a client"
        owned.append(client_idx)
        if p.test_source == "test":
            assert len(np.unique(cl.test)) == len(cl.test)
            assert cl.test.max(initial=-1) < len(test_labels)
        if cl.stages:
            assert np.array_equal(np.sort(np.concatenate([s.train for s in cl.stages])), np.sort(cl.train))
            assert np.array_equal(np.sort(np.concatenate([s.test for s in cl.stages])), np.sort(cl.test))
            assert np.array_equal(np.sort(np.concatenate([s.val for s in cl.stages])), np.sort(cl.val))
    allidx = np.concatenate(owned)
    assert len(np.unique(allidx)) == len(allidx), "an index is used by two clients"
    assert set(allidx.tolist()) <= kept
    total = sum(int(c.train_counts(p.num_classes).sum() + c.val_counts(p.num_classes).sum()) for c in p.clients)
    if p.test_source == "train":
        total += sum(int(c.test_counts(p.num_classes).sum()) for c in p.clients)
    assert total == len(allidx)
    if whole_pool:
        assert total == len(p.kept)
    else:
        assert total <= len(p.kept)
    assert np.array_equal(p.global_train_counts, np.bincount(train_labels[p.kept], minlength=p.num_classes))


SCHEME_CASES = [
    ("iid", dict(scheme="iid", imbalance=10), True),
    ("dirichlet", dict(scheme="dirichlet", imbalance=10, alpha=0.5), True),
    ("dirichlet-balanced", dict(scheme="dirichlet", imbalance=10, balanced=True), True),
    ("dirichlet-quantity", dict(scheme="dirichlet", imbalance=10, quantity=(50, 120)), False),
    ("pathological", dict(scheme="pathological", imbalance=10, classes_per_client=2), True),
    ("pathological-quantity", dict(scheme="pathological", classes_per_client=3, quantity=(50, 150)), False),
    ("dominant", dict(scheme="dominant", samples_per_client=200), False),
    ("stages", dict(scheme="stages", imbalance=10, classes_per_stage=2, stages=5), True),
    ("stages-balanced", dict(scheme="stages", imbalance=10, classes_per_stage=4, stages=5, balanced=True), True),
]


@pytest.mark.parametrize("local_test", ["sampled", "holdout"])
@pytest.mark.parametrize("name,kw,whole", SCHEME_CASES, ids=[c[0] for c in SCHEME_CASES])
def test_scheme_integrity(c10, name, kw, whole, local_test) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(**kw, local_test=local_test, val_fraction=0.1), seed=0)
    assert len(p.clients) == 20
    assert p.test_source == ("train" if local_test == "holdout" else "test")
    check_integrity(p, tr, te, whole)


@pytest.mark.parametrize("name,kw,whole", [
    ("dirichlet", dict(scheme="dirichlet", num_clients=50, imbalance=100, alpha=0.1, min_samples=5), True),
    ("pathological", dict(scheme="pathological", num_clients=100, classes_per_client=8), True),
    ("stages", dict(scheme="stages", num_clients=100, classes_per_stage=4, stages=1, imbalance=10), True),
    ("dominant", dict(scheme="dominant", num_clients=20, samples_per_client=300, imbalance=10), False),
], ids=["dirichlet", "pathological", "stages", "dominant"])
def test_scheme_integrity_100_classes(c100, name, kw, whole) -> None:
    tr, te = c100
    p = make_partition(tr, te, 100, _cfg(**kw), seed=3)
    check_integrity(p, tr, te, whole)


@pytest.mark.parametrize("imbalance", [1.0, 10.0, 100.0])
def test_longtail_formula_exact(c10, c100, imbalance) -> None:
    for (tr, te), c, n_max in ((c10, 10, 600), (c100, 100, 500)):
        p = make_partition(tr, te, c, _cfg(scheme="iid", imbalance=imbalance, num_clients=5), seed=1)
        expected = [math.floor(n_max * imbalance ** (-k / (c - 1))) for k in range(c)]
        assert p.global_train_counts.tolist() == expected
        assert len(p.kept) == sum(expected)
    if imbalance == 1.0:
        assert len(p.kept) == len(c100[0])


def test_longtail_caps_at_class_size() -> None:
    tr = np.concatenate([np.zeros(100, int), np.ones(5, int)])  # class 1 smaller than its target 10
    p = make_partition(tr, np.array([0, 1]), 2, _cfg(scheme="iid", imbalance=10, num_clients=1), seed=0)
    assert p.global_train_counts.tolist() == [100, 5]


@pytest.mark.parametrize("name,kw,whole", SCHEME_CASES, ids=[c[0] for c in SCHEME_CASES])
def test_seed_reproducible(c10, name, kw, whole) -> None:
    tr, te = c10
    cfg = _cfg(**kw, val_fraction=0.1)
    a, b = make_partition(tr, te, 10, cfg, seed=7), make_partition(tr, te, 10, cfg, seed=7)
    other = make_partition(tr, te, 10, cfg, seed=8)
    assert np.array_equal(a.kept, b.kept)
    for x, y in zip(a.clients, b.clients):
        for f in ("train", "test", "val"):
            assert np.array_equal(getattr(x, f), getattr(y, f))
    assert any(not np.array_equal(x.train, y.train) for x, y in zip(a.clients, other.clients))


def test_dirichlet_min_samples(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(alpha=0.1, min_samples=100, num_clients=20), seed=0)
    assert min(len(c.train) for c in p.clients) >= 100


def test_dirichlet_balanced_equal_sizes(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(balanced=True, imbalance=10, num_clients=7), seed=0)
    sizes = [len(c.train) for c in p.clients]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_gives_up_with_clear_error(c10) -> None:
    tr, te = c10
    # Tiny alpha puts each class on ~one client: 50 clients can never all reach 100 samples.
    with pytest.raises(ConfigError, match="--alpha"):
        make_partition(tr, te, 10, _cfg(alpha=0.001, num_clients=50, min_samples=100), seed=0)


def test_pathological_classes_per_client(c10) -> None:
    tr, te = c10
    for k in (1, 2, 3):
        p = make_partition(tr, te, 10, _cfg(scheme="pathological", classes_per_client=k), seed=0)
        for i, cl in enumerate(p.clients):
            held = np.flatnonzero(cl.train_counts(10)).tolist()
            assert held == sorted({(i * k + j) % 10 for j in range(k)})


@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_quantity_sizes_in_range(c10, scheme) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme=scheme, quantity=(50, 350), num_clients=20,
                                        classes_per_client=3), seed=2)
    sizes = [len(c.train) for c in p.clients]
    assert all(50 <= s <= 350 for s in sizes)
    assert len(set(sizes)) > 1


def test_quantity_pool_too_small(c10) -> None:
    tr, te = c10
    with pytest.raises(ConfigError, match="--quantity"):
        make_partition(tr, te, 10, _cfg(quantity=(400, 500), num_clients=20), seed=0)


def test_dominant_groups_match_fedrema(c10) -> None:
    expected = [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8], [8, 9, 0]]
    assert dominant_label_sets(10, 5) == expected
    tr, te = c10
    cfg = _cfg(scheme="dominant", samples_per_client=200, iid_fraction=0.2)
    p = make_partition(tr, te, 10, cfg, seed=0)
    for i, cl in enumerate(p.clients):
        counts = cl.train_counts(10)
        assert counts.sum() == 200
        in_group = counts[expected[i % 5]].sum()
        assert in_group >= 160  # the 40 IID samples may also hit the group's labels
        assert counts.sum() - in_group <= 40


def test_sampled_test_follows_training_proportions(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme="iid", imbalance=10, num_clients=5), seed=0)
    for cl in p.clients:
        t, s = cl.train_counts(10), cl.test_counts(10)
        size = math.floor(0.25 * t.sum() + 0.5)
        assert s.sum() == size
        assert np.all(np.abs(s - size * t / t.sum()) < 1.0 + 1e-9)
    p = make_partition(tr, te, 10, _cfg(alpha=0.3, num_clients=20), seed=0)
    for cl in p.clients:
        t, s = cl.train_counts(10), cl.test_counts(10)
        assert s.sum() <= math.floor(0.25 * t.sum() + 0.5)
        assert np.all(s <= 100)
        assert np.all(s[t == 0] == 0)
        if s.sum() >= np.count_nonzero(t):
            assert np.all(s[t > 0] >= 1)
        assert np.array_equal(s, sampled_counts(t, np.full(10, 100), 0.25))


def test_allocate_largest_remainder_and_caps() -> None:
    assert allocate(10, np.array([1, 1, 1]), np.array([9, 9, 9])).tolist() == [4, 3, 3]
    assert allocate(10, np.array([8, 1, 1]), np.array([2, 9, 9])).tolist() == [2, 4, 4]
    assert allocate(5, np.array([1, 0, 1]), np.array([1, 9, 1])).tolist() == [1, 0, 1]
    assert sampled_counts(np.array([97, 2, 1]), np.array([50, 50, 50]), 0.1).tolist() == [8, 1, 1]


def test_holdout_keeps_a_train_sample_per_class(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(local_test="holdout", test_fraction=0.5, alpha=0.3), seed=0)
    for cl in p.clients:
        whole = cl.train_counts(10) + cl.test_counts(10)
        assert np.all(cl.train_counts(10)[whole > 0] >= 1)
        assert abs(cl.test_counts(10).sum() - 0.5 * whole.sum()) <= np.count_nonzero(whole)


def test_stages_shape(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme="stages", classes_per_stage=3, stages=3, num_clients=8,
                                        val_fraction=0.1), seed=0)
    for cl in p.clients:
        assert len(cl.stages) == 3
        for st in cl.stages:
            cls = st.classes.tolist()
            assert len(cls) == 3 == len(set(cls))  # S distinct classes per stage task
            assert set(np.flatnonzero(st.train_counts(10)).tolist()) == set(cls)
            assert set(np.flatnonzero(st.test_counts(10)).tolist()) <= set(cls)
            assert len(st.test) > 0
    # Every class is held when N·S·M >= C, so the whole pool is used.
    assert sum(len(c.train) + len(c.val) for c in p.clients) == len(p.kept)


def test_stage_classes_recur_and_every_class_has_an_equal_share_of_slots(c10) -> None:
    # [20, 2, 5] on 10 classes: 200 class slots, 20 per class; classes come back in later stages
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme="stages", classes_per_stage=2, stages=5, imbalance=10), seed=0)
    slots = [st.classes.tolist() for cl in p.clients for st in cl.stages]
    assert all(len(c) == 2 == len(set(c)) for c in slots)
    assert np.bincount(np.concatenate(slots), minlength=10).tolist() == [20] * 10
    recurs = [set(st.classes.tolist()) & {c for e in cl.stages[:k] for c in e.classes.tolist()}
              for cl in p.clients for k, st in enumerate(cl.stages)]
    assert sum(bool(r) for r in recurs) > 0
    held = [len({c for st in cl.stages for c in st.classes.tolist()}) for cl in p.clients]
    assert min(held) < 10  # not every client ends with all classes (the old rotation did)
    # a class's samples are split evenly among its slots: sizes follow the long tail
    sizes = [len(cl.train) for cl in p.clients]
    assert max(sizes) > 1.2 * min(sizes)
    assert sum(sizes) == len(p.kept)


def test_balanced_stages_give_equal_clients_and_keep_the_long_tail(c10) -> None:
    tr, te = c10
    cfg = _cfg(scheme="stages", classes_per_stage=4, stages=5, imbalance=100, balanced=True)
    p = make_partition(tr, te, 10, cfg, seed=1)
    sizes = [len(cl.train) for cl in p.clients]
    assert max(sizes) - min(sizes) <= 5 * 4  # M·S shards of equal size ±1
    assert sum(sizes) == len(p.kept)  # the whole long-tailed pool: its class profile is kept
    counts = sum(cl.train_counts(10) for cl in p.clients)
    assert counts.tolist() == p.global_train_counts.tolist() and counts[0] > 50 * counts[9]
    stage_sizes = [len(st.train) for cl in p.clients for st in cl.stages]
    assert max(stage_sizes) - min(stage_sizes) <= 4
    for cl in p.clients:
        for st in cl.stages:  # a stage's classes are the labels of its samples
            assert st.classes.tolist() == np.flatnonzero(st.train_counts(10)).tolist()
    # the head class holds 40 % of the pool, more shards than slots: spread at most two per slot
    per_slot = [len(st.classes) for cl in p.clients for st in cl.stages]
    assert min(per_slot) >= 3


def test_distinct_rows_removes_repeats_where_the_counts_allow() -> None:
    from fedtail.partition.schemes import distinct_rows

    rng = np.random.default_rng(0)
    keys = np.array([[0, 0, 1], [0, 2, 2], [1, 1, 3], [3, 3, 2]])
    perm = distinct_rows(keys, rng)
    assert sorted(perm.tolist()) == list(range(12))
    out = keys.reshape(-1)[perm].reshape(4, 3)
    assert all(len(set(row)) == 3 for row in out.tolist())
    assert sorted(out.reshape(-1).tolist()) == sorted(keys.reshape(-1).tolist())
    # key 0 has 5 entries for 3 rows: no row without a repeat exists; they spread 2, 2, 1
    crowded = np.array([[0, 0, 0], [0, 0, 1], [1, 2, 2]])
    out = crowded.reshape(-1)[distinct_rows(crowded, rng)].reshape(3, 3)
    assert sorted(int((row == 0).sum()) for row in out) == [1, 2, 2]
    assert all(len(set(row[row != 0].tolist())) == len(row[row != 0]) for row in out)


PAPER_STAGE_SETTINGS = [  # the STHFL (GLDP) paper, Tables 1-3: [N, S, M] on CIFAR-10 and CIFAR-100
    (10, 100, 4, 1), (10, 100, 5, 1), (10, 20, 4, 5), (10, 20, 5, 5),
    (100, 100, 20, 1), (100, 100, 30, 1), (100, 20, 20, 5), (100, 20, 30, 5),
]


@pytest.fixture(scope="module")
def cifar10_labels() -> tuple[np.ndarray, np.ndarray]:
    return _labels(10, 5000, 5), _labels(10, 1000, 6)  # CIFAR-10's split sizes


@pytest.mark.parametrize("classes,n,s,m", PAPER_STAGE_SETTINGS)
@pytest.mark.parametrize("imbalance", [10, 50, 100])
def test_every_paper_stage_setting_builds(cifar10_labels, c100, classes, n, s, m, imbalance) -> None:
    tr, te = cifar10_labels if classes == 10 else c100  # CIFAR-100: 500 training images per class
    for balanced in (True, False):
        cfg = _cfg(scheme="stages", num_clients=n, classes_per_stage=s, stages=m, imbalance=imbalance,
                   balanced=balanced)
        p = make_partition(tr, te, classes, cfg, seed=0)
        check_integrity(p, tr, te, whole_pool=True)
        assert all(len(cl.stages) == m for cl in p.clients) and len(p.clients) == n
        if balanced:
            sizes = [len(cl.train) for cl in p.clients]
            assert max(sizes) - min(sizes) <= m * s


def test_summary_json_shape(c10, tmp_path) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme="stages", num_clients=4, stages=2, val_fraction=0.1), seed=0)
    s = json.loads(json.dumps(p.summary()))
    assert len(s["global_train_counts"]) == 10 and len(s["clients"]) == 4
    for c in s["clients"]:
        for key in ("train_counts", "test_counts", "val_counts"):
            assert len(c[key]) == 10 and all(isinstance(x, int) for x in c[key])
        assert len(c["stages"]) == 2 and len(c["stages"][0]["classes"]) == 2
    p.to_json(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text()) == s
    flat = make_partition(tr, te, 10, _cfg(scheme="iid", num_clients=3), seed=0).summary()
    assert "stages" not in flat["clients"][0]


def test_class_frequency_groups(c10) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(scheme="iid", imbalance=10, num_clients=2), seed=0)
    assert p.class_frequency_groups() == ([0, 1, 2, 3], [4, 5, 6], [7, 8, 9])
    p.global_train_counts = np.array([5, 5, 9, 1, 1, 1, 0, 0, 0, 0])  # ties resolved by class id
    assert p.class_frequency_groups() == ([2, 0, 1, 3], [4, 5, 6], [7, 8, 9])


def test_heatmap_written(c10, c100, tmp_path) -> None:
    tr, te = c10
    p = make_partition(tr, te, 10, _cfg(num_clients=10), seed=0)
    plot_heatmap(p, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tr, te = c100
    p = make_partition(tr, te, 100, _cfg(num_clients=100, min_samples=1), seed=0)
    plot_heatmap(p, tmp_path / "big.png")
    assert (tmp_path / "big.png").stat().st_size > 1000


@pytest.mark.parametrize("kw,msg", [
    (dict(alpha=-1.0), r"--alpha must be > 0 \(got -1.0\)"),
    (dict(num_clients=0), "--clients must be >= 1"),
    (dict(imbalance=0.5), "--imbalance must be >= 1"),
    (dict(iid_fraction=1.5), "--iid-fraction"),
    (dict(test_fraction=0.0), "--test-fraction"),
    (dict(val_fraction=1.0), "--val-fraction"),
    (dict(quantity=(10, 5)), "--quantity"),
    (dict(scheme="iid", quantity=(10, 20)), "--quantity only applies"),
    (dict(scheme="iid", balanced=True), "--balanced"),
    (dict(local_test="holdout", test_fraction=1.0), "--test-fraction"),
    (dict(min_samples=-1), "--min-samples"),
    (dict(stages=0, scheme="stages"), "--stages"),
])
def test_bad_config_values(kw, msg) -> None:
    with pytest.raises(ValidationError, match=msg):
        PartitionConfig(**kw)


def test_config_forbids_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        PartitionConfig(num_client=3)


@pytest.mark.parametrize("kw,msg", [
    (dict(scheme="pathological", classes_per_client=12), r"--classes-per-client must be in 1..10 \(got 12\)"),
    (dict(scheme="dominant", groups=11), "--groups"),
    (dict(scheme="stages", classes_per_stage=11, stages=1), r"--classes-per-stage must be in 1..10"),
])
def test_check_needs_num_classes(c10, kw, msg) -> None:
    cfg = PartitionConfig(**kw)
    with pytest.raises(ConfigError, match=msg):
        cfg.check(10)
    with pytest.raises(ConfigError, match=msg):
        make_partition(*c10, 10, cfg, seed=0)


def test_empty_client_errors() -> None:
    tr, te = np.repeat(np.arange(2), 5), np.arange(2)
    with pytest.raises(ConfigError, match="client 10 with no training samples.*--clients"):
        make_partition(tr, te, 2, _cfg(scheme="iid", num_clients=12), seed=0)
    with pytest.raises(ConfigError, match="--min-samples"):
        make_partition(tr, te, 2, _cfg(num_clients=12, min_samples=1), seed=0)
    with pytest.raises(ConfigError, match="--samples-per-client"):
        make_partition(tr, te, 2, _cfg(scheme="dominant", groups=2, num_clients=3, samples_per_client=5),
                       seed=0)


def test_bad_labels(c10) -> None:
    tr, te = c10
    with pytest.raises(ConfigError, match="0..9"):
        make_partition(tr, te + 5, 10, _cfg(), seed=0)


def test_schemes_listed() -> None:
    assert set(SCHEMES) == {"iid", "dirichlet", "pathological", "dominant", "stages", "natural", "semantic"}
    assert all(isinstance(v, str) and "\n" not in v for v in SCHEMES.values())
