"""Server-held data (partition.server_samples_per_class / server_unlabelled) and ServerContext.server_data."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from conftest import tiny_config
from fedtail.engine import prepare
from fedtail.errors import ConfigError
from fedtail.partition.longtail import longtail_counts
from helpers import simulation


def server_config(per_class: int = 6, unlabelled: int = 40, seed: int = 0, **partition):
    return tiny_config(
        seed=seed,
        partition={"server_samples_per_class": per_class, "server_unlabelled": unlabelled, "imbalance": 5.0}
        | partition,
    )


def client_train_indices(partition) -> np.ndarray:
    """Every index into the train split a client holds (train, validation, holdout test)."""
    holdout = partition.test_source == "train"
    return np.concatenate([np.concatenate([c.train, c.val] + ([c.test] if holdout else [])) for c in partition.clients])


@pytest.mark.parametrize(
    "partition",
    [{}, {"scheme": "stages", "classes_per_stage": 1, "stages": 3}, {"local_test": "holdout", "val_fraction": 0.1}],
)
def test_server_sets_are_balanced_disjoint_and_seeded(partition):
    dataset, part = prepare(server_config(**partition))
    labels = dataset.train.labels
    server = part.server
    assert np.bincount(labels[server.labelled], minlength=5).tolist() == [6] * 5
    assert len(server.unlabelled) == 40
    held = np.concatenate([server.labelled, server.unlabelled])
    assert len(np.unique(held)) == len(held)  # labelled and unlabelled are disjoint
    assert not np.intersect1d(held, client_train_indices(part)).size
    assert not np.intersect1d(held, part.kept).size  # the clients' pool never contains them
    _, again = prepare(server_config(**partition))
    assert np.array_equal(again.server.labelled, server.labelled)
    assert np.array_equal(again.server.unlabelled, server.unlabelled)
    _, other = prepare(server_config(seed=1, **partition))
    assert not np.array_equal(other.server.labelled, server.labelled)


def test_long_tail_cut_applies_to_the_rest():
    dataset, part = prepare(server_config())
    labels = dataset.train.labels
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate([part.server.labelled, part.server.unlabelled]))
    expected = longtail_counts(np.bincount(labels[rest], minlength=5), 5.0)
    assert part.global_train_counts.tolist() == expected.tolist()


def test_server_data_is_recorded_in_the_partition_summary_and_config():
    config = server_config()
    dataset, part = prepare(config)
    summary = part.summary()["server"]
    assert summary["labelled_counts"] == [6] * 5
    assert sum(summary["unlabelled_counts"]) == 40
    dumped = config.model_dump(mode="json")["partition"]
    assert dumped["server_samples_per_class"] == 6 and dumped["server_unlabelled"] == 40


def test_server_context_exposes_the_index_views():
    sim = simulation(server_config())
    data = sim.server_ctx.server_data
    assert data.split is sim.dataset.train
    assert torch.equal(data.labelled, torch.as_tensor(sim.partition.server.labelled))
    assert torch.equal(data.unlabelled, torch.as_tensor(sim.partition.server.unlabelled))
    x, y = sim.dataset.batch(data.split, data.labelled)
    assert len(x) == 30 and torch.bincount(y, minlength=5).tolist() == [6] * 5


def test_absent_when_zero():
    config = tiny_config()
    _, part = prepare(config)
    assert part.server is None and "server" not in part.summary()
    dumped = config.model_dump(mode="json")["partition"]
    assert "server_samples_per_class" not in dumped and "server_unlabelled" not in dumped
    data = simulation(config).server_ctx.server_data
    assert len(data.labelled) == 0 and len(data.unlabelled) == 0


def fingerprint(config) -> tuple[str, str]:
    """Hashes of the partition (kept pool, every client's views, summary) and of config.json."""
    _, part = prepare(config)
    h = hashlib.sha256()
    h.update(part.kept.tobytes())
    for c in part.clients:
        for a in (c.train, c.test, c.val):
            h.update(a.tobytes())
        for s in c.stages:
            for a in (s.classes, s.train, s.test, s.val):
                h.update(np.asarray(a).tobytes())
    h.update(json.dumps(part.summary()).encode())
    dumped = json.dumps(config.model_dump(mode="json"), sort_keys=True).encode()
    return h.hexdigest()[:16], hashlib.sha256(dumped).hexdigest()[:16]


# Recorded before the server options existed: with them at 0, partitions and config.json are unchanged
# (the stages partition re-recorded when its scheme changed: classes may recur across a client's stages).
@pytest.mark.parametrize(
    "overrides, seed, expected",
    [
        ({}, 0, ("e982b52d52d40cdf", "f7e33b58dc072160")),
        ({"partition": {"imbalance": 10.0}}, 3, ("5812c826036794a9", "f16bd65c9812f77c")),
        ({"partition": {"scheme": "iid", "local_test": "holdout", "val_fraction": 0.1}}, 0,
         ("17c98a8922277137", "2b734b8e92172ad7")),
        ({"partition": {"scheme": "stages", "classes_per_stage": 1, "stages": 3, "imbalance": 5.0}, "rounds": 3}, 0,
         ("dbab0ce6fc7a9d0d", "05802de9e7af6141")),
    ],
)
def test_option_off_is_bit_identical_to_before(overrides, seed, expected):
    assert fingerprint(tiny_config(seed=seed, **overrides)) == expected
    explicit = dict(overrides)
    explicit["partition"] = overrides.get("partition", {}) | {"server_samples_per_class": 0, "server_unlabelled": 0}
    assert fingerprint(tiny_config(seed=seed, **explicit)) == expected


def test_errors():
    with pytest.raises(ConfigError, match="partition.server_samples_per_class must be >= 0"):
        tiny_config(partition={"server_samples_per_class": -1})
    with pytest.raises(ConfigError, match="partition.server_unlabelled must be >= 0"):
        tiny_config(partition={"server_unlabelled": -2})
    # 80 training samples per class: the clients must keep at least one.
    with pytest.raises(ConfigError, match="server_samples_per_class 80 must be below the 80 training samples of class 0"):
        prepare(tiny_config(partition={"server_samples_per_class": 80}))
    with pytest.raises(ConfigError, match="server_unlabelled 350 must be below the 350 training samples"):
        prepare(tiny_config(partition={"server_samples_per_class": 10, "server_unlabelled": 350}))
