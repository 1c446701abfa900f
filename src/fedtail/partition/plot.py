"""Clients × classes heatmap of training counts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the CLI writes files, never opens windows

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedtail.partition.partition import Partition  # noqa: E402

# Cells are annotated with their counts only while the grid is small enough for text to fit.
_ANNOTATE_MAX_CELLS = 400


def plot_heatmap(partition: Partition, path: str | Path) -> None:
    """Write a PNG heatmap (rows = clients, columns = classes) of training sample counts.

    With stage tasks a row per client stage task (client i's M stages in order), white lines
    between clients, so a class that comes back in a later stage shows in the client's block.
    """
    counts = partition.train_count_matrix()
    stages = len(partition.clients[0].stages) if partition.clients else 0
    if stages:
        counts = np.stack([st.train_counts(partition.num_classes) for cl in partition.clients for st in cl.stages])
    n_clients, n_classes = counts.shape
    # Grow with the grid but stay within a printable size (100 × 100 fits in 16 × 14 inches).
    width = min(max(6.0, 0.14 * n_classes + 3.0), 16.0)
    height = min(max(4.0, 0.12 * n_clients + 2.0), 14.0)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    title = f"training samples per client and class ({n_clients} clients, {n_classes} classes)"
    if stages:
        ax.set_ylabel(f"client (a row per stage task, {stages} per client)")
        title = f"samples per client stage task ({n_clients // stages} clients × {stages} stages, {n_classes} classes)"
        for b in range(stages, n_clients, stages):
            ax.axhline(b - 0.5, color="white", lw=0.8)
    if partition.scheme:
        title = f"{partition.scheme}: {title}"
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=min(n_classes, 20), integer=True))
    if stages:
        clients = n_clients // stages
        ticks = range(0, clients, max(1, clients // 20))
        ax.set_yticks([i * stages + (stages - 1) / 2 for i in ticks], [str(i) for i in ticks])
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=min(n_clients, 20), integer=True))
    fig.colorbar(im, ax=ax, label="training samples")
    if n_clients * n_classes <= _ANNOTATE_MAX_CELLS:
        threshold = counts.max() / 2 if counts.size else 0
        for r in range(n_clients):
            for c in range(n_classes):
                ax.text(c, r, str(int(counts[r, c])), ha="center", va="center", fontsize=7,
                        color="black" if counts[r, c] > threshold else "white")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
