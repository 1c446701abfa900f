"""Shared fixtures: tiny synthetic runs that need no files and finish in a second."""

from __future__ import annotations

from typing import Any

import pytest

from fedtail.config import RunConfig
from fedtail.components import build_config


def tiny_raw(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "algorithm": "fedavg",
        "dataset": "synthetic",
        "dataset_options": {"num_classes": 5, "dim": 16, "train_per_class": 80, "test_per_class": 40},
        "model": "mlp",
        "partition": {"scheme": "dirichlet", "num_clients": 6, "alpha": 0.5, "min_samples": 5},
        "train": {"local_epochs": 1, "batch_size": 16, "lr": 0.05},
        "fraction": 0.5,
        "rounds": 3,
        "seed": 0,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = raw[key] | value
        else:
            raw[key] = value
    return raw


def tiny_config(**overrides: Any) -> RunConfig:
    return build_config(tiny_raw(**overrides))


@pytest.fixture
def tiny() -> RunConfig:
    return tiny_config()
