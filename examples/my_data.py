"""Own data, two ways.

1. A file: write arrays to an .npz and pass ``--dataset npz:FILE`` (``x``: N×C×H×W images or
   N×D vectors, ``y``: labels, optional ``client``: client ids, optional ``split``: train/test).
   With client ids, ``--partition natural --clients K`` keeps the data's own clients:

       python examples/my_data.py runs/hospitals.npz      # writes a small example file
       fedtail run --dataset npz:runs/hospitals.npz --model mlp --partition natural --clients 4 \
           --local-test own --rounds 5 --out runs/hospitals

2. A loader: a function returning a fedtail Dataset, passed by import path
   (``--dataset my_data:blobs``, its keyword options through ``--set dataset_options.KEY=V``).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from fedtail.api import Dataset, Split


def write_example(path: str, clients: int = 4, per_client: int = 120, dim: int = 12, seed: int = 0) -> None:
    """Vectors of 3 classes from ``clients`` sources, each source with its own class mix and shift."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, dim)) * 3
    xs, ys, ids = [], [], []
    for c in range(clients):
        mix = rng.dirichlet(np.ones(3) * 0.7)
        y = rng.choice(3, size=per_client, p=mix)
        xs.append(centres[y] + rng.normal(size=(per_client, dim)) + rng.normal(size=dim))
        ys.append(y)
        ids.append(np.full(per_client, c))
    y = np.concatenate(ys)
    split = np.where(rng.random(len(y)) < 0.2, "test", "train")
    np.savez(path, x=np.concatenate(xs).astype(np.float32), y=y, client=np.concatenate(ids), split=split)


def blobs(num_classes: int = 3, dim: int = 8, per_class: int = 100, seed: int = 0) -> Dataset:
    """A loader: Gaussian blobs, 80 % train and 20 % test."""
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(num_classes, dim, generator=g)
    y = torch.arange(num_classes).repeat_interleave(per_class)
    x = centres[y] + torch.randn(len(y), dim, generator=g)
    order = torch.randperm(len(y), generator=g)
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return Dataset(
        name="blobs",
        train=Split(x[train], y[train]),
        test=Split(x[test], y[test]),
        num_classes=num_classes,
        input_shape=(dim,),
        mean=(0.0,) * dim,
        std=(1.0,) * dim,
    )


if __name__ == "__main__":
    write_example(sys.argv[1] if len(sys.argv) > 1 else "hospitals.npz")
