"""Clients × classes heatmap of training counts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the CLI writes files, never opens windows

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedtail.partition.partition import Partition  # noqa: E402

# Cells are annotated with their counts only while the grid is small enough for text to fit.
_ANNOTATE_MAX_CELLS = 400


def plot_heatmap(partition: Partition, path: str | Path) -> None:
    """Write a PNG heatmap (rows = clients, columns = classes) of training sample counts."""
    counts = partition.train_count_matrix()
    n_clients, n_classes = counts.shape
    # Grow with the grid but stay within a printable size (100 × 100 fits in 16 × 14 inches).
    width = min(max(6.0, 0.14 * n_classes + 3.0), 16.0)
    height = min(max(4.0, 0.12 * n_clients + 2.0), 14.0)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    title = f"training samples per client and class ({n_clients} clients, {n_classes} classes)"
    if partition.scheme:
        title = f"{partition.scheme}: {title}"
    ax.set_title(title, fontsize=10)
    for axis, n in ((ax.xaxis, n_classes), (ax.yaxis, n_clients)):
        axis.set_major_locator(MaxNLocator(nbins=min(n, 20), integer=True))
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
