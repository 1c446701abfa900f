"""PNG figures of ``fedtail report``.

* :func:`plot_accuracy_curves`: personalised accuracy vs round, one subplot per setting, one
  line per method (mean over seeds) with a shaded min–max band over seeds.
* :func:`plot_acmu`: MuPFL's ACMU clustering as logged per round in ``metrics.jsonl``
  (``rounds_log[i]["acmu"]``: a list of per-edge records ``{"edge", "kappa", "silhouette",
  "clients", "clusters", "pca": [[x, y], ...]}``): a PCA scatter of the client updates
  coloured by cluster, rows = edges, columns = a few rounds. The clustered methods' single
  ``rounds_log[i]["clustering"]`` record is drawn the same way, as edge 0.
* :func:`plot_similarity`: FedReMa's client-similarity matrix S(t) at the logged rounds
  (``rounds_log[i]["fedrema_similarity"]``, option ``similarity_rounds``) as heatmaps (its Fig. 3).
* :func:`plot_client_similarity`: the clients' pairwise label-distribution KL, model L2 distance
  and LrCos at a ``--similarity-rounds`` round (an evaluation row's ``client_similarity``), with the
  samples per class per client beside them (FedAC's Fig. 2 (a)-(d)).
* :func:`plot_class_probabilities`: the global model's mean predicted probability of every class
  for the test images of each class, and of the right class as bars (``--class-probabilities``;
  MuPFL's Fig. 3(b)).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: the CLI writes files, never opens windows

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _colors(n: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def accuracy_series(
    rows_per_seed: Iterable[list[dict[str, Any]]], key: str = "personalized_acc", x: str = "round"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds (the rows' ``x``) and the mean, min and max over seeds of ``key`` at each."""
    by_round: dict[int, list[float]] = {}
    for rows in rows_per_seed:
        for row in rows:
            rnd, acc = row.get(x, row.get("round")), row.get(key)
            if isinstance(rnd, int) and isinstance(acc, (int, float)) and math.isfinite(acc):
                by_round.setdefault(rnd, []).append(float(acc))
    rounds = np.array(sorted(by_round), dtype=int)
    values = [by_round[r] for r in rounds]
    return (
        rounds,
        np.array([np.mean(v) for v in values]),
        np.array([np.min(v) for v in values]),
        np.array([np.max(v) for v in values]),
    )


def plot_accuracy_curves(
    curves: dict[tuple[str, str], list[list[dict[str, Any]]]],
    settings: Sequence[str],
    methods: Sequence[str],
    path: Path,
    key: str = "personalized_acc",
    last: int | None = None,
    title: str = "Personalised accuracy per round (mean over seeds, band = min–max)",
) -> bool:
    """``curves[(setting, method)]`` = metrics rows of each seed. Returns False if nothing to plot.

    ``key``: the plotted value of each row; ``last``: only the final ``last`` rounds (of global
    optimisation: the rows' ``global_round`` where they have one), plotted against those rounds.
    """
    if last is not None:
        curves = {cell: [_final_rounds(rows, last) for rows in seeds] for cell, seeds in curves.items()}
    x = "round" if last is None else "global_round"
    settings = [s for s in settings if any(accuracy_series(curves.get((s, m)) or [], key, x)[0].size for m in methods)]
    if not settings:
        return False
    ncols = min(len(settings), 3)
    nrows = math.ceil(len(settings) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.6 * ncols, 6.4), 3.4 * nrows + 0.6), squeeze=False, dpi=110)
    colors = dict(zip(methods, _colors(len(methods))))
    handles: dict[str, Any] = {}
    for ax, setting in zip(axes.flat, settings):
        for method in methods:
            seeds = curves.get((setting, method)) or []
            rounds, mean, low, high = accuracy_series(seeds, key, x)
            if not len(rounds):
                continue
            (line,) = ax.plot(rounds, 100 * mean, color=colors[method], lw=1.6, marker="." if len(rounds) < 30 else None)
            if len(seeds) > 1:
                ax.fill_between(rounds, 100 * low, 100 * high, color=colors[method], alpha=0.18, lw=0)
            handles.setdefault(method, line)
        ax.set_title(setting, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round" if last is None else "round of global optimisation")
        ax.set_ylabel("personalised accuracy (%)" if key == "personalized_acc" else f"{key} (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(settings):]:
        ax.set_visible(False)
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 7), fontsize=9, frameon=False
    )
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08 if nrows == 1 else 0.04, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def _final_rounds(rows: list[dict[str, Any]], last: int) -> list[dict[str, Any]]:
    """The rows of the final ``last`` rounds (of global optimisation), by their ``global_round``."""
    numbered = [r for r in rows if isinstance(r.get("global_round", r.get("round")), int)]
    if not numbered:
        return []
    end = max(r.get("global_round", r["round"]) for r in numbered)
    return [r | {"global_round": r.get("global_round", r["round"])} for r in numbered
            if r.get("global_round", r["round"]) > end - last]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# ACMU clustering (MuPFL)


def acmu_records(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Round -> valid per-edge ACMU records found in the ``rounds_log`` of metrics rows.

    The ``clustering`` record of the clustered methods (FedAC, IFCA, ...) counts as one edge
    (edge 0) with κ = its number of clusters, so their runs get the same scatter.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        for entry in row.get("rounds_log") or []:
            if not isinstance(entry, dict):
                continue
            found = entry.get("acmu")
            if isinstance(entry.get("clustering"), dict):
                rec = entry["clustering"]
                found = [{"edge": 0, "kappa": rec.get("num_clusters"), "source": "clustering"} | rec]
            rnd = entry.get("round")
            if not isinstance(found, list) or not isinstance(rnd, int):
                continue
            records = [r for r in found if _valid_record(r)]
            if records:
                out[rnd] = records
    return out


def _valid_record(rec: Any) -> bool:
    if not isinstance(rec, dict):
        return False
    pca, clusters = rec.get("pca"), rec.get("clusters")
    if not isinstance(pca, list) or not isinstance(clusters, list) or len(pca) != len(clusters) or not pca:
        return False
    return all(isinstance(p, (list, tuple)) and len(p) >= 2 for p in pca)


def pick_rounds(rounds: Sequence[int], k: int) -> list[int]:
    """Up to ``k`` rounds spread evenly from the first to the last."""
    rounds = sorted(rounds)
    if len(rounds) <= k:
        return rounds
    idx = sorted({int(round(i)) for i in np.linspace(0, len(rounds) - 1, k)})
    return [rounds[i] for i in idx]


def plot_acmu(
    rows: list[dict[str, Any]], path: Path, title: str = "", max_rounds: int = 4, max_edges: int = 3,
    color_by: str = "clusters",
) -> bool:  # fmt: skip
    """PCA scatter of client updates coloured by ACMU cluster (``color_by="kmeans"``: by the plain
    k-means of the clients' models the record holds, Fig. 10's "K-Means" panel); False if the log
    has no such records."""
    records = {rnd: recs for rnd, recs in acmu_records(rows).items() if all(color_by in r for r in recs)}
    if not records:
        return False
    rounds = pick_rounds(list(records), max_rounds)
    edges = sorted({int(r.get("edge", 0)) for rnd in rounds for r in records[rnd]})[:max_edges]
    fig, axes = plt.subplots(
        len(edges), len(rounds), figsize=(max(3.4 * len(rounds), 6.4), 3.1 * len(edges) + 0.5), squeeze=False, dpi=110
    )
    for j, rnd in enumerate(rounds):
        by_edge = {int(r.get("edge", 0)): r for r in records[rnd]}
        for i, edge in enumerate(edges):
            ax = axes[i][j]
            rec = by_edge.get(edge)
            if rec is None:
                ax.set_axis_off()
                ax.set_title(f"round {rnd}, edge {edge}: no record", fontsize=8)
                continue
            xy = np.array([[float(p[0]), float(p[1])] for p in rec["pca"]])
            clusters = [int(c) if isinstance(c, (int, float)) else -1 for c in rec[color_by]]
            palette = _colors(max(max(clusters) + 1, 1))
            for c in sorted(set(clusters)):
                mask = np.array([k == c for k in clusters])
                ax.scatter(
                    xy[mask, 0], xy[mask, 1], s=28, color=palette[c] if c >= 0 else "grey",
                    edgecolor="black", linewidth=0.4, label=f"cluster {c}",
                )  # fmt: skip
            clients = rec.get("clients")
            if isinstance(clients, list) and len(clients) == len(xy) and len(xy) <= 30:
                for (x, y), cid in zip(xy, clients):
                    ax.annotate(str(cid), (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
            kappa, sil = rec.get("kappa"), rec.get("silhouette")
            sub = f"κ={kappa}" if kappa is not None else ""
            if color_by == "kmeans":
                sub = f"k-means of the models, k={len(set(clusters))}"
            elif isinstance(sil, (int, float)) and math.isfinite(sil):
                sub += f", silhouette {sil:.2f}"
            ax.set_title(f"round {rnd}, edge {edge}\n{sub}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("PC 1", fontsize=7)
            ax.set_ylabel("PC 2", fontsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle(title or "Clients (PCA), coloured by cluster", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def similarity_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FedReMa's logged S(t) matrices (``fedrema_similarity``), by round."""
    found = [log["fedrema_similarity"] for row in rows for log in row.get("rounds_log", [])
             if isinstance(log.get("fedrema_similarity"), dict) and log["fedrema_similarity"].get("S")]  # fmt: skip
    return sorted(found, key=lambda rec: rec["round"])


def plot_similarity(rows: list[dict[str, Any]], path: Path, title: str = "", max_rounds: int = 4) -> bool:
    """Heatmaps of S(t) at up to ``max_rounds`` logged rounds, on one colour scale [0, 1] (cosines of
    soft-logit vectors, which are non-negative); False if the log has none."""
    records = similarity_records(rows)
    if not records:
        return False
    by_round = {rec["round"]: rec for rec in records}
    rounds = pick_rounds(list(by_round), max_rounds)
    fig, axes = plt.subplots(1, len(rounds), figsize=(3.3 * len(rounds) + 1.0, 3.4), squeeze=False, dpi=110)
    image = None
    for ax, rnd in zip(axes[0], rounds):
        rec = by_round[rnd]
        image = ax.imshow(np.array(rec["S"], dtype=float), vmin=0.0, vmax=1.0, cmap="viridis")
        clients = rec.get("clients") or []
        if len(clients) <= 20:
            ax.set_xticks(range(len(clients)), [str(c) for c in clients], fontsize=6)
            ax.set_yticks(range(len(clients)), [str(c) for c in clients], fontsize=6)
        ax.set_title(f"t = {rnd}", fontsize=9)
        ax.set_xlabel("client", fontsize=7)
        ax.set_ylabel("client", fontsize=7)
    fig.colorbar(image, ax=list(axes[0]), shrink=0.85, label="S (cosine of soft logits)")
    fig.suptitle(title or "Client similarity S(t)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True


def client_similarity_records(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(round, record) of every evaluation row that logged ``client_similarity``."""
    return [(row["round"], row["client_similarity"]) for row in rows if isinstance(row.get("client_similarity"), dict)]


def plot_client_similarity(
    rows: list[dict[str, Any]], path: Path, class_counts: np.ndarray | None = None, title: str = "",
    rnd: int | None = None,
) -> bool:  # fmt: skip
    """FedAC's Fig. 2 at one logged round (default: the last): (a) samples per class per client
    (``class_counts``, clients × classes, if given), (b) KL of the label distributions, (c) L2
    distance of the evaluated models, (d) their LrCos; False if the log has none."""
    records = dict(client_similarity_records(rows))
    if not records:
        return False
    rnd = max(records) if rnd is None else rnd
    rec = records[rnd]
    clients = rec.get("clients") or []
    panels: list[tuple[str, np.ndarray, str]] = []
    if class_counts is not None:
        panels.append(("(a) samples per class", np.asarray(class_counts, dtype=float)[clients].T, "samples"))
    panels += [
        (f"(b) KL of label distributions (+{rec.get('kl_smoothing', 1):g} per class)", np.array(rec["kl"], dtype=float), "KL"),
        ("(c) L2 distance of models", np.array(rec["l2"], dtype=float), "L2"),
        (f"(d) LrCos (PCA, D = {rec.get('lrcos_dims')})", np.array(rec["lrcos"], dtype=float), "cosine"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False, dpi=110)
    for ax, (name, matrix, label) in zip(axes[0], panels):
        cmap = "viridis_r" if label in ("KL", "L2") else "viridis"  # alike = bright in every panel
        image = ax.imshow(matrix, cmap=cmap, vmin=-1.0 if label == "cosine" else None,
                          vmax=1.0 if label == "cosine" else None, aspect="auto", interpolation="nearest")  # fmt: skip
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("client", fontsize=7)
        ax.set_ylabel("class" if label == "samples" else "client", fontsize=7)
        if len(clients) <= 20:
            ax.set_xticks(range(len(clients)), [str(c) for c in clients], fontsize=6)
            if label != "samples":
                ax.set_yticks(range(len(clients)), [str(c) for c in clients], fontsize=6)
        fig.colorbar(image, ax=ax, shrink=0.8, label=label)
    fig.suptitle(title or f"Client similarity at round {rnd}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_class_probabilities(rows: list[dict[str, Any]], path: Path, title: str = "") -> bool:
    """The last evaluation row's ``global_class_probabilities`` as a heatmap (true class × predicted
    class) beside the mean probability of the right class per class; False if the log has none."""
    logged = [r for r in rows if isinstance(r.get("global_class_probabilities"), list)]
    if not logged:
        return False
    row = logged[-1]
    matrix = np.array([[np.nan if v is None else v for v in line] for line in row["global_class_probabilities"]])
    classes = range(len(matrix))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.8), dpi=110)
    image = left.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis")
    left.set_xlabel("predicted class", fontsize=8)
    left.set_ylabel("true class", fontsize=8)
    left.set_xticks(list(classes))
    left.set_yticks(list(classes))
    left.set_title("mean softmax", fontsize=9)
    fig.colorbar(image, ax=left, shrink=0.85)
    right.bar(list(classes), np.diag(matrix), color=_colors(1)[0])
    right.set_ylim(0, 1)
    right.set_xticks(list(classes))
    right.set_xlabel("class", fontsize=8)
    right.set_ylabel("mean probability of the right class", fontsize=8)
    entropy = row.get("global_prediction_entropy")
    right.set_title(f"round {row.get('round')}; mean entropy {entropy:.3f} nats" if entropy is not None else "", fontsize=9)
    fig.suptitle(title or "Prediction probabilities of each class", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def spread(n: int, k: int) -> list[int]:
    """``k`` positions of ``range(n)`` evenly spread from the first to the last (all if n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)}) if k > 1 else [0]


def plot_masks(panels: Sequence[tuple[str, dict[str, np.ndarray]]], path: Path, num_classes: int, clients: int = 4,
               title: str = "", order: Sequence[int] | None = None) -> bool:
    """MuPFL's Fig. 9: per sampled test image the input, its true mask and each run's predicted mask;
    ``panels``: (label, a run's ``masks.npz``) pairs of runs on the same partition. ``clients``
    clients spread evenly over ``order`` (positions in the sampled clients, e.g. head to tail
    classes; default: their order), every image sampled of each. Ignored pixels are black. False
    when no run sampled a mask."""
    panels = [(label, m) for label, m in panels if len(m["clients"])]
    if not panels:
        return False
    first = panels[0][1]
    order = list(range(len(first["clients"]))) if order is None else list(order)
    picks = [(order[j], k) for j in spread(len(order), clients) for k in range(first["images"].shape[1])]
    cmap = plt.get_cmap("tab20", max(num_classes, 2))
    colours = lambda mask: np.where((mask >= 0)[..., None], cmap(np.clip(mask, 0, None) % 20)[..., :3], 0.0)  # noqa: E731
    cols = 2 + len(panels)
    fig, axes = plt.subplots(len(picks), cols, figsize=(1.7 * cols, 1.7 * len(picks) + 0.4), dpi=110, squeeze=False)
    for r, (i, k) in enumerate(picks):
        image = first["images"][i, k]
        shown = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
        cells = [("input", shown, "gray"), ("ground truth", colours(first["truth"][i, k]), None)]
        for label, m in panels:
            j = np.flatnonzero(m["clients"] == first["clients"][i])
            mask = m["predicted"][j[0], k] if len(j) else np.full_like(first["predicted"][i, k], -1)
            cells.append((label, colours(mask), None))
        for c, (label, data, cm) in enumerate(cells):
            ax = axes[r][c]
            ax.imshow(data, cmap=cm, interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(label, fontsize=8)
            if c == 0:
                ax.set_ylabel(f"client {int(first['clients'][i])}, image {k + 1}", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
