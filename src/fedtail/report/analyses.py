"""Analyses of ``fedtail report`` beyond the accuracy tables.

* :func:`rounds_to_table`: rounds until the personalised accuracy first reaches given levels (the
  MuPFL paper's "communication rounds to reach 80 % / 90 %" comparison). The round is the first
  *evaluated* round at or above the level, so with ``eval_every = k`` it is exact up to k − 1
  rounds; a seed that never reaches it counts as "not reached", never as its last round.
* :func:`sensitivity_groups` / :func:`plot_sensitivity`: a hyperparameter's sensitivity curve
  (FedAC's Figure 4, MuPFL's Table V, FedReMa's Table 3), found without being told: methods of one
  algorithm whose runs are configured identically except for one numeric option form a curve of
  final accuracy against that option's value. :func:`grid_verdicts` names each curve's best value
  and whether it lies inside the grid or at an edge (a grid to extend before the value is used).
* :func:`cluster_counts` / :func:`plot_cluster_counts`: the number of clusters per round of the
  clustered methods (FedAC's CNT, MuPFL's κ), from the ``clustering`` / ``acmu`` entries of the
  ``rounds_log`` in ``metrics.jsonl``, which are logged every round.
* :func:`ccp_length` / :func:`ccp_table`: how many rounds FedReMa's critical co-learning period
  lasted (its Table 3), from the ``fedrema`` entries of the ``rounds_log``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedtail.errors import FedtailError  # noqa: E402
from fedtail.machine import run_capability  # noqa: E402
from fedtail.report.collect import Collection, Run  # noqa: E402
from fedtail.report.tables import DASH, Cell, cell, format_cell, markdown_table  # noqa: E402

# ---------------------------------------------------------------------------------------------
# rounds to an accuracy level


def check_levels(levels: Sequence[float]) -> list[float]:
    """Levels in percent, each in (0, 100], sorted, without repeats; FedtailError otherwise."""
    out = sorted(set(float(v) for v in levels))
    bad = [v for v in out if not (0 < v <= 100) or not math.isfinite(v)]
    if bad:
        raise FedtailError(f"--rounds-to takes accuracy levels in percent, in (0, 100]; got {bad}")
    return out


def first_round_at(rows: list[dict[str, Any]], level: float, key: str = "personalized_acc") -> int | None:
    """The first evaluated round whose ``key`` is at least ``level`` (a fraction); None if never."""
    for row in sorted((r for r in rows if isinstance(r.get("round"), int)), key=lambda r: r["round"]):
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and value >= level - 1e-12:
            return int(row["round"])
    return None


def headline_key(run: Run) -> str:
    """The value a run's rounds to a level count: a segmentation run's mIoU, else the accuracy."""
    final = (run.summary or {}).get("final") or {}
    return "personalized_miou" if final.get("personalized_miou") is not None else "personalized_acc"


def rounds_to_text(runs: list[Run], level: float) -> str:
    """A cell: mean ± std of the rounds over the seeds that reached ``level`` (percent), and how many did."""
    if not runs:
        return DASH
    reached = [r for r in (first_round_at(run.metrics(), level / 100, headline_key(run)) for run in runs) if r is not None]
    total = len(runs)
    if not reached:
        last = max((run.summary or {}).get("rounds") or 0 for run in runs)
        return f"not reached ({last} rounds)" if last else "not reached"
    text = str(reached[0]) if len(reached) == 1 else f"{statistics.fmean(reached):.1f} ± {statistics.stdev(reached):.1f}"
    return text + (f" ({len(reached)} of {total} seeds)" if len(reached) < total else f" ({total} seed{'s' * (total > 1)})")


ClientsTo = tuple[float, tuple[int, ...]]  # --clients-to LEVEL:K,...: an accuracy level (percent), client counts


def parse_clients_to(texts: Sequence[str]) -> list[ClientsTo]:
    """``--clients-to 70:15,20,25`` -> [(70.0, (15, 20, 25))]; FedtailError on a malformed value."""
    out = []
    for text in texts:
        level, sep, counts = str(text).partition(":")
        try:
            value = float(level)
            ks = tuple(int(k) for k in counts.split(",") if k.strip())
        except ValueError:
            ks, value = (), float("nan")
        if not sep or not ks or any(k < 1 for k in ks) or not 0 < value <= 100:
            raise FedtailError(
                f"--clients-to takes LEVEL:K[,K...], an accuracy level in percent and client counts, e.g. 70:15,20,25 "
                f"(got {text!r})"
            )
        out.append((value, ks))
    return out


def first_clients_at(rows: list[dict[str, Any]], level: float, k: int) -> tuple[float, int] | None:
    """(seconds, round) of the first evaluation at which at least ``k`` clients' own accuracy is at
    least ``level`` (a fraction): the wall time of MuPFL's Fig. 8(a); None if never."""
    for row in sorted((r for r in rows if isinstance(r.get("round"), int)), key=lambda r: r["round"]):
        accs = row.get("per_client_acc")
        seconds = row.get("elapsed_s")
        if not isinstance(accs, list) or not isinstance(seconds, (int, float)):
            continue
        if sum(isinstance(a, (int, float)) and a >= level - 1e-12 for a in accs) >= k:
            return float(seconds), int(row["round"])
    return None


STOP_FACTOR = 5.0  # an interval this many times the run's median pace (or more) ...
STOP_SECONDS = 300.0  # ... and this many seconds longer than that pace holds a stop of the process


def stops(rows: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(round, next evaluated round, excess seconds) where a run's ``elapsed_s`` jumps: an interval
    between evaluations at least :data:`STOP_FACTOR` times the run's median seconds per round for its
    rounds and :data:`STOP_SECONDS` longer, which load on a machine does not give but a stopped
    process (``kill -STOP``, a machine asleep) does. Runs made since ``engine/clock.py`` leave stops
    of 5 s or more out of ``elapsed_s``, so this finds the stops of older runs."""
    points = sorted((int(r["round"]), float(r["elapsed_s"])) for r in rows
                    if isinstance(r.get("round"), int) and isinstance(r.get("elapsed_s"), (int, float)))  # fmt: skip
    steps = [(a, b, (t1 - t0) / (b - a), t1 - t0) for (a, t0), (b, t1) in zip(points, points[1:]) if b > a]
    if len(steps) < 3:
        return []
    pace = statistics.median(rate for _, _, rate, _ in steps)
    return [(a, b, gap - pace * (b - a)) for a, b, _, gap in steps
            if gap >= STOP_FACTOR * pace * (b - a) and gap - pace * (b - a) >= STOP_SECONDS]  # fmt: skip


def stop_notes(runs: Sequence[Run]) -> list[str]:
    """One line per finished run whose times hold a stop (:func:`stops`)."""
    out = []
    for run in runs:
        found = stops(run.metrics()) if run.finished else []
        if found:
            spans = ", ".join(f"about {excess:.0f} s between rounds {a} and {b}" for a, b, excess in found)
            out.append(f"{run.dir}: its process stood stopped ({spans}: elapsed_s jumped to at least "
                       f"{STOP_FACTOR:g} times the run's median seconds per round); its wall times and time to "
                       "accuracy count those seconds")
    return out


def clients_to_text(runs: list[Run], level: float, k: int) -> str:
    """A cell: mean ± std of the seconds (and rounds) over the seeds whose k clients reached ``level``."""
    if not runs:
        return DASH
    found = [f for f in (first_clients_at(run.metrics(), level / 100, k) for run in runs) if f is not None]
    if not found:
        return "not reached"
    seconds, rounds = [s for s, _ in found], [r for _, r in found]
    text = f"{seconds[0]:.0f} s (round {rounds[0]})" if len(found) == 1 else (
        f"{statistics.fmean(seconds):.0f} ± {statistics.stdev(seconds):.0f} s (round {statistics.fmean(rounds):.1f})")
    return text + (f" ({len(found)} of {len(runs)} seeds)" if len(found) < len(runs) else "")


def clients_to_table(col: Collection, spec: ClientsTo) -> str:
    """Methods × (setting, k): wall seconds until k clients reach the level (``--clients-to``)."""
    level, ks = spec
    header = ["method"] + [f"{s}: {k} client{'s' * (k > 1)}" for s in col.settings for k in ks]
    rows = [[m] + [clients_to_text(col.finished(s, m), level, k) for s in col.settings for k in ks] for m in col.methods]
    return markdown_table(header, rows)


def rounds_to_table(col: Collection, levels: Sequence[float]) -> str:
    """Methods × (setting, level): rounds to reach each level of personalised accuracy."""
    levels = check_levels(levels)
    header = ["method"] + [f"{s}: {lv:g} %" for s in col.settings for lv in levels]
    rows = [
        [m] + [rounds_to_text(col.finished(s, m), lv) for s in col.settings for lv in levels] for m in col.methods
    ]
    return markdown_table(header, rows)


# ---------------------------------------------------------------------------------------------
# sensitivity to one option


@dataclass
class Sensitivity:
    algorithm: str
    option: str
    points: dict[str, float] = field(default_factory=dict)  # method -> the option's value

    @property
    def title(self) -> str:
        return f"{self.algorithm}: {self.option}"


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _effective_options(config: dict[str, Any]) -> dict[str, Any]:
    """The run's options with the algorithm's defaults filled in where the algorithm is known
    (a method that leaves an option at its default then lines up with one that names it)."""
    options = dict(config.get("options") or {})
    try:
        from fedtail.components import algorithm

        alg = algorithm(str(config.get("algorithm")))
        return {**alg.config().model_dump(mode="json"), **alg.reference.options, **options}
    except Exception:  # an algorithm this installation cannot load: its options as written
        return options


def sensitivity_groups(col: Collection) -> list[Sensitivity]:
    """Curves of ≥ 3 methods of one algorithm that differ in exactly one numeric option (and in
    nothing else of their configs, seeds aside), in method order; each method in one curve per option."""
    configs: dict[str, dict[str, Any]] = {}
    for m in col.methods:
        for s in col.settings:
            # a value that diverged is a point of its curve too: the grid was tried there
            runs = [r for r in col.finished(s, m) + col.diverged(s, m) if r.named is None and r.config]
            if runs:
                configs[m] = runs[0].config  # type: ignore[assignment]
                break
    rest = {m: {k: v for k, v in c.items() if k not in ("options", "seed")} for m, c in configs.items()}
    options = {m: _effective_options(c) for m, c in configs.items()}
    groups: dict[tuple[str, str, str], Sensitivity] = {}
    methods = list(configs)
    for i, a in enumerate(methods):
        for b in methods[i + 1 :]:
            if rest[a] != rest[b]:
                continue
            keys = set(options[a]) | set(options[b])
            differ = [k for k in keys if options[a].get(k) != options[b].get(k)]
            if len(differ) != 1:
                continue
            key = differ[0]
            va, vb = _number(options[a].get(key)), _number(options[b].get(key))
            if va is None or vb is None:
                continue
            # the options other than `key` identify the curve
            others = repr(sorted((k, repr(v)) for k, v in options[a].items() if k != key))
            g = groups.setdefault((str(configs[a].get("algorithm")), key, others), Sensitivity(str(configs[a]["algorithm"]), key))
            g.points.setdefault(a, va)
            g.points.setdefault(b, vb)
    out = [g for g in groups.values() if len(g.points) >= 3]
    order = {m: i for i, m in enumerate(col.methods)}
    return sorted(out, key=lambda g: min(order[m] for m in g.points))


def diverged_values(col: Collection, g: Sensitivity, setting: str) -> list[float]:
    """The option's values on curve ``g`` whose every run in ``setting`` diverged (none finished)."""
    return sorted(x for m, x in g.points.items() if col.diverged(setting, m) and not col.finished(setting, m))


def curve_runs(col: Collection, g: Sensitivity, setting: str, method: str) -> list[Run]:
    """The finished runs behind one point of curve ``g``: the method's own, except on FedReMa's δ
    curve where runs with MDS every round exist. There each seed's point is the run that stands for
    that δ in Table 3's rows (:func:`delta_sources`: its own run, another δ's whose CCP ended in the
    same round, or the MDS-every-round run where it does not end), so every δ is compared on the same
    seeds, as the table beside it does."""
    if g.algorithm == "fedrema" and g.option == "delta":
        sources = delta_sources(col, setting, g.points[method])
        if sources:
            return [src.run for _, src in sorted(sources.items(), key=lambda kv: (kv[0] is None, kv[0])) if src.run]
    return col.finished(setting, method)


def has_stand_ins(col: Collection, groups: list[Sensitivity]) -> bool:
    """Whether any point of the curves takes a seed's run from another method (:func:`curve_runs`)."""
    return any(r.method != m for g in groups for m in g.points for s in col.settings for r in curve_runs(col, g, s, m))


def _point_label(col: Collection, g: Sensitivity, method: str) -> str:
    """``method``, and which of its point's runs (:func:`curve_runs`) were made as another method:
    "fedrema-delta0.9 (seed 0: = fedrema-delta0.7)"; the setting is named when there are several."""
    where = (lambda s: f" ({s})") if len(col.settings) > 1 else (lambda s: "")
    others = [f"seed {r.seed}{where(s)}: = {r.method}" for s in col.settings for r in curve_runs(col, g, s, method)
              if r.method != method]  # fmt: skip
    return f"{method} ({'; '.join(others)})" if others else method


def _option_bounds(algorithm_name: str, option: str) -> tuple[float | None, float | None]:
    """The inclusive bounds the algorithm's config declares for ``option`` (``Field(ge=..., le=...)``);
    None where it declares none or the algorithm cannot be loaded."""
    try:
        from fedtail.components import algorithm

        field_info = algorithm(algorithm_name).config.model_fields[option]
    except Exception:
        return None, None
    low = high = None
    for m in field_info.metadata:
        low = _number(getattr(m, "ge", None)) if low is None else low
        high = _number(getattr(m, "le", None)) if high is None else high
    return low, high


_METRIC_NAMES = {"last10": "last-10 mean", "final": "final round"}


def grid_verdicts(col: Collection, groups: list[Sensitivity]) -> list[str]:
    """Per curve and setting: the option's value with the highest accuracy and where it lies in
    the grid (inside, or at an edge: a grid to extend before the value is used), by the mean over
    seeds of the last-10 mean (``summary.json`` → ``last10``) and of the final round, the two
    metrics validation rules use; a metric some run lacks is left out. Values whose runs all
    diverged are named; one beyond the best value's edge closes the grid on that side. A curve
    measured on test data names an edge without advising to extend the grid: values are chosen
    on validation data, and a grid widened after a look at test accuracy tunes on the test set."""
    lines = []
    for g in groups:
        low, high = _option_bounds(g.algorithm, g.option)
        for s in col.settings:
            runs = {m: r for m in g.points if (r := curve_runs(col, g, s, m))}
            on_test = any(r.eval_split == "test" for rs in runs.values() for r in rs)
            test_note = " (test data: values are chosen on validation data, not here)"
            extend_low = test_note if on_test else ": extend the grid below it"
            extend_high = test_note if on_test else ": extend the grid above it, if the option allows"
            diverged = diverged_values(col, g, s)
            found = {}  # metric -> (best values, top accuracy, where, runner-up gap)
            for which in ("last10", "final"):
                cells = {m: cell(r, which) for m, r in runs.items()}
                if any(c.n != len(runs[m]) for m, c in cells.items()):
                    continue
                values = sorted({g.points[m] for m in cells})
                if len(values) < 3:
                    continue
                top = max(c.mean for c in cells.values())
                best = sorted({g.points[m] for m, c in cells.items() if c.mean == top})
                # the runner-up and its gap, so that a tie-margin rule can be read off
                rest = {g.points[m]: c.mean for m, c in cells.items() if g.points[m] not in best}
                runner = max(rest, key=lambda x: rest[x]) if rest else None
                gap = "" if runner is None else f"; next {runner:g}, {100 * (top - rest[runner]):.2f} points lower"
                below = [x for x in diverged if x < values[0]]
                above = [x for x in diverged if x > values[-1]]
                if best[0] == values[0]:
                    where = (f"at the option's lower bound ({low:g}): the grid cannot extend" if low == values[0]
                             else f"at the lowest value that ran to the end; {below[-1]:g} below it diverged" if below
                             else "at the grid's lower edge" + extend_low)  # fmt: skip
                elif best[-1] == values[-1]:
                    where = (f"at the option's upper bound ({high:g}): the grid cannot extend" if high == values[-1]
                             else f"at the highest value that ran to the end; {above[0]:g} above it diverged" if above
                             else "at the grid's upper edge" + extend_high)  # fmt: skip
                else:
                    where = "inside the grid"
                found[which] = (" = ".join(f"{x:g}" for x in best), top, where, gap)
            head = f"- {g.title}, {s}: "
            if len(found) == 2 and found["last10"][0] == found["final"][0]:
                shown, _, where, gap = found["last10"]
                lines.append(f"{head}best {g.option} = {shown} (last-10 mean {100 * found['last10'][1]:.2f} %{gap}; "
                             f"final round {100 * found['final'][1]:.2f} %{found['final'][3]}), {where}.")  # fmt: skip
            elif found:
                parts = [f"by the {_METRIC_NAMES[w]}, best {g.option} = {b} ({100 * t:.2f} %{gap}), {where}"
                         for w, (b, t, where, gap) in found.items()]  # fmt: skip
                lines.append(head + "; ".join(parts) + ".")
            if found and diverged:
                lines[-1] += f" Diverged: {g.option} = {', '.join(f'{x:g}' for x in diverged)}."
    return lines


def _scale(ax: Any, values: list[float]) -> None:
    positive = [v for v in values if v > 0]
    if len(positive) >= 2 and max(positive) / min(positive) >= 50:
        if min(values) > 0:
            ax.set_xscale("log")
        elif min(values) == 0:
            ax.set_xscale("symlog", linthresh=min(positive))


def plot_sensitivity(col: Collection, groups: list[Sensitivity], path: Path, which: str = "final") -> bool:
    """One subplot per curve: ``which`` accuracy (mean over seeds, error bar = min–max) against the
    option's value, one line per setting. False when there is nothing to plot."""
    if not groups:
        return False
    ncols = min(len(groups), 3)
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.4 * ncols, 6.0), 3.3 * nrows + 0.5), squeeze=False, dpi=110)
    colors = plt.get_cmap("tab10")
    drawn = False
    for ax, g in zip(axes.flat, groups):
        for j, s in enumerate(col.settings):
            xs, mean, low, high = [], [], [], []
            for m, x in sorted(g.points.items(), key=lambda kv: kv[1]):
                vals = [
                    float(v) for r in curve_runs(col, g, s, m)
                    if isinstance(v := ((r.summary or {}).get(which) or {}).get("personalized_acc"), (int, float))
                ]  # fmt: skip
                if vals:
                    xs.append(x)
                    mean.append(100 * statistics.fmean(vals))
                    low.append(100 * min(vals))
                    high.append(100 * max(vals))
            if not xs:
                continue
            drawn = True
            m_arr = np.array(mean)
            err = np.array([m_arr - np.array(low), np.array(high) - m_arr])
            ax.errorbar(xs, mean, yerr=err, marker="o", ms=4, lw=1.4, capsize=3, color=colors(j % 10), label=s)
        _scale(ax, list(g.points.values()))
        lost = sorted({x for s in col.settings for x in diverged_values(col, g, s)})
        ax.set_title(g.title + (f" ({g.option} {', '.join(f'{x:g}' for x in lost)}: diverged)" if lost else ""), fontsize=10)
        ax.set_xlabel(g.option)
        ax.set_ylabel(f"{which} personalised accuracy (%)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    if not drawn:
        plt.close(fig)
        return False
    # two lines: one subplot's width does not hold the title on one
    fig.suptitle("Sensitivity: accuracy against one option, the rest fixed\n(mean over seeds, bars = min–max)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def sensitivity_table(col: Collection, groups: list[Sensitivity]) -> str:
    """The numbers behind :func:`plot_sensitivity`: one row per (curve, value), with the final
    round and, where any run of the curves has it, the last-10 mean of each setting: the two
    metrics :func:`grid_verdicts` ranks by, so that a rule on either is read off the table."""
    from fedtail.report.tables import cell_text

    metrics = ["final"]
    if any(cell(curve_runs(col, g, s, m), "last10").n for g in groups for m in g.points for s in col.settings):
        metrics.append("last10")
    rows = [
        [g.title, f"{x:g}", _point_label(col, g, m)]
        + [cell_text(col, s, m, w, runs=curve_runs(col, g, s, m)) for s in col.settings for w in metrics]
        for g in groups
        for m, x in sorted(g.points.items(), key=lambda kv: kv[1])
    ]
    columns = [s if len(metrics) == 1 else f"{s}, {_METRIC_NAMES[w]}" for s in col.settings for w in metrics]
    return markdown_table(["curve", "value", "method"] + columns, rows, ["l", "r", "l"] + ["r"] * len(columns))


# ---------------------------------------------------------------------------------------------
# number of clusters per round


def cluster_counts(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Rounds and the number of clusters at each (the mean of the edges' κ for ACMU with several
    edges), from every ``rounds_log`` entry that has one; empty lists for unclustered runs."""
    by_round: dict[int, float] = {}
    for row in rows:
        for entry in row.get("rounds_log") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("round"), int):
                continue
            k: float | None = None
            rec = entry.get("clustering")
            if isinstance(rec, dict) and _number(rec.get("num_clusters")) is not None:
                k = float(rec["num_clusters"])
            acmu = entry.get("acmu")
            if isinstance(acmu, list):
                kappas = [float(r["kappa"]) for r in acmu if isinstance(r, dict) and _number(r.get("kappa")) is not None]
                if kappas:
                    k = statistics.fmean(kappas)
            if k is not None:
                by_round[entry["round"]] = k
    rounds = sorted(by_round)
    return rounds, [by_round[r] for r in rounds]


def plot_cluster_counts(col: Collection, path: Path) -> list[tuple[str, float]] | None:
    """Number of clusters per round of each clustered method (first seed), one subplot per setting.

    Methods whose count never changes (a fixed K) are left out of the figure when any method's
    count does change, so that an adaptive count (FedAC's CNT) is not flattened under fixed Ks of
    80–100; they are returned as (method, K) for the caption. None when nothing is drawn."""
    curves: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for s in col.settings:
        for m in col.methods:
            for run in col.finished(s, m):
                if run.named is not None:
                    continue
                rounds, ks = cluster_counts(run.metrics())
                if rounds:
                    curves.setdefault(s, {})[m] = (rounds, ks)
                    break
    if not curves:
        return None
    fixed_ks = {m: ks[0] for c in curves.values() for m, (_, ks) in c.items() if min(ks) == max(ks)}
    fixed_ks = {m: k for m, k in fixed_ks.items() if all(m not in c or m in fixed_ks for c in curves.values())}
    if any(m not in fixed_ks for c in curves.values() for m in c):  # something adapts: draw only that
        curves = {s: {m: v for m, v in c.items() if m not in fixed_ks} for s, c in curves.items()}
        curves = {s: c for s, c in curves.items() if c}
        fixed = [(m, fixed_ks[m]) for m in col.methods if m in fixed_ks]
    else:
        fixed = []
    settings = [s for s in col.settings if s in curves]
    methods = [m for m in col.methods if any(m in c for c in curves.values())]
    # 20 colours, then the same colours dashed, dotted, ...: no two methods share a line
    cmap = plt.get_cmap("tab20" if len(methods) > 10 else "tab10")
    per = 20 if len(methods) > 10 else 10
    styles = {m: (cmap(i % per), ("-", "--", ":", "-.")[(i // per) % 4]) for i, m in enumerate(methods)}
    ncols = min(len(settings), 3)
    nrows = math.ceil(len(settings) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.6 * ncols, 6.4), 3.2 * nrows + 0.8), squeeze=False, dpi=110)
    handles: dict[str, Any] = {}
    for ax, s in zip(axes.flat, settings):
        for m, (rounds, ks) in curves[s].items():
            color, style = styles[m]
            (line,) = ax.step(rounds, ks, where="post", lw=1.3, color=color, linestyle=style)
            handles.setdefault(m, line)
        ax.set_title(s, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("clusters")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(settings) :]:
        ax.set_visible(False)
    fig.suptitle("Number of clusters per round (first seed of each method)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    # beside the plots: long method names do not fit under them
    fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return fixed


# ---------------------------------------------------------------------------------------------
# FedReMa's critical co-learning period


@dataclass
class CCP:
    rounds: int  # rounds aggregated by MDS (the CCP's length once it has ended)
    ended: bool  # the CCP ended within the run (False: it outlasted the run, or the run had no CCP end)
    run_rounds: int  # rounds the run logged


def fedrema_records(run: Run) -> dict[int, dict[str, Any]]:
    """Round -> the ``fedrema`` record of that round, from ``metrics.jsonl``'s rounds logs and
    ``summary.json``'s (rounds after the last evaluation)."""
    entries = [e for row in run.metrics() for e in row.get("rounds_log") or []]
    entries += list((run.summary or {}).get("rounds_log") or [])
    return {
        e["round"]: e["fedrema"]
        for e in entries
        if isinstance(e, dict) and isinstance(e.get("round"), int) and isinstance(e.get("fedrema"), dict)
    }


def ccp_length(run: Run) -> CCP | None:
    """The CCP of a FedReMa run: the ``fedrema`` records of ``metrics.jsonl``'s rounds logs and of
    ``summary.json``'s (rounds after the last evaluation); None for a run without them. A record
    says ``ccp`` (that round aggregated by MDS), ``ccp_rounds`` (MDS rounds so far) and, in the
    round the CCP ends, ``ended``; after it, ``ccp`` is false."""
    by_round = fedrema_records(run)
    if not by_round:
        return None
    records = [by_round[r] for r in sorted(by_round)]
    ended = any(rec.get("ended") or rec.get("ccp") is False for rec in records)
    length = records[-1].get("ccp_rounds")
    if not isinstance(length, int):
        return None
    return CCP(rounds=length, ended=ended, run_rounds=max(by_round))


def ccp_text(runs: list[Run]) -> str | None:
    """A cell: the CCP's length in rounds, mean ± std over the seeds whose CCP ended, and how many
    outlasted the run ("> R"); None when no run of the cell has FedReMa's records."""
    found = [c for c in (ccp_length(r) for r in runs) if c is not None]
    if not found:
        return None
    ended = [c.rounds for c in found if c.ended]
    open_ = [c for c in found if not c.ended]
    parts = []
    if ended:
        text = str(ended[0]) if len(ended) == 1 else f"{statistics.fmean(ended):.1f} ± {statistics.stdev(ended):.1f}"
        parts.append(f"{text} ({len(ended)} seed{'s' * (len(ended) > 1)})")
    if open_:
        longest = max(c.run_rounds for c in open_)
        parts.append(f"> {longest} (did not end: {len(open_)} seed{'s' * (len(open_) > 1)})")
    return "; ".join(parts)


PAPER_DELTAS = (0.1, 0.3, 0.5, 0.7, 0.9)  # FedReMa's Table 3
RATIO_TIE = 1e-9  # fedtail.algorithms.fedrema.TIE: a ratio within it of δ counts as δ


def ccp_ends(run: Run, deltas: Sequence[float] = PAPER_DELTAS) -> tuple[list[int | None], int] | None:
    """For a FedReMa run with MDS every round (``ccp = false``): the round each δ's CCP would end,
    the first whose logged ratio Δs̄^t / max Δs̄ (Eq. 9) is below δ, None when none is (it
    outlasts the run), and the last round logged. A run with δ is this run until then, so this is
    its CCP's length. None for any other run (its ratios after its own CCP's end are not logged)."""
    options = (run.config or {}).get("options") or {}
    if (run.config or {}).get("algorithm") != "fedrema" or options.get("ccp", True) is not False:
        return None
    by_round = fedrema_records(run)
    if not by_round:
        return None
    ordered = [(r, by_round[r].get("ratio")) for r in sorted(by_round)]
    ends = [next((r for r, q in ordered if isinstance(q, (int, float)) and q < d - RATIO_TIE), None) for d in deltas]
    return ends, ordered[-1][0]


def ccp_delta_table(col: Collection, deltas: Sequence[float] = PAPER_DELTAS) -> str | None:
    """Setting × method × seed of the MDS-every-round FedReMa runs: each δ's CCP length read from
    the logged ratios (Table 3's "epochs of CCP" for every δ, whether or not a run with that δ was
    made); None when the collection has no such run."""
    rows = []
    for s in col.settings:
        for m in col.methods:
            for run in col.finished(s, m):
                found = ccp_ends(run, deltas)
                if found is None:
                    continue
                ends, last = found
                cells = [str(e) if e is not None else f"> {last}" for e in ends]
                rows.append([s, m, str(run.seed) if run.seed is not None else DASH] + cells)
    if not rows:
        return None
    return markdown_table(["setting", "method", "seed"] + [f"δ {d:g}" for d in deltas], rows)


def ccp_end_round(run: Run) -> int | None:
    """The round in which a FedReMa run's CCP ended (its record says ``ended``); None if it never did."""
    by_round = fedrema_records(run)
    return next((r for r in sorted(by_round) if by_round[r].get("ended")), None)


@dataclass
class DeltaSource:
    """Where one seed's numbers for one δ come from."""

    # the round the δ's CCP ended: in the δ's own run where one was made, else read from the
    # MDS-every-round run's ratios (None: not within the run)
    end: int | None
    last: int  # the last round logged by the run ``end`` comes from
    run: Run | None  # the run whose accuracy and cost stand for this δ (None: no run equals it)
    note: str  # how ``run`` was chosen


def delta_sources(col: Collection, setting: str, delta: float) -> dict[int | None, DeltaSource]:
    """Seed -> the run that stands for FedReMa with ``delta`` in ``setting`` (MDS on, seeds of the
    MDS-every-round runs): the run made with that δ; else, as a run with δ is the MDS-every-round
    run until its CCP ends and δ plays no part afterwards, a run of another δ whose CCP ended in
    the same round, or the MDS-every-round run itself when the CCP would not end within the run."""
    def fedrema_runs(ccp: bool) -> list[tuple[Run, dict[str, Any]]]:
        out = []
        for m in col.methods:
            for run in col.finished(setting, m):
                opts = _effective_options(run.config or {})
                if (run.config or {}).get("algorithm") == "fedrema" and opts.get("mds", True) and bool(opts.get("ccp", True)) == ccp:
                    out.append((run, opts))
        return out

    with_ccp = fedrema_runs(True)
    found: dict[int | None, DeltaSource] = {}
    for base, _ in fedrema_runs(False):
        ends = ccp_ends(base, [delta])
        if ends is None or base.seed in found:
            continue
        end, last = ends[0][0], ends[1]
        same_seed = [(r, o) for r, o in with_ccp if r.seed == base.seed]
        exact = [r for r, o in same_seed if _number(o.get("delta")) is not None and abs(float(o["delta"]) - delta) < 1e-12]
        if exact:
            own = ccp_end_round(exact[0])
            note = "its own run" if own == end else (
                f"its own run, whose CCP ended in round {own if own is not None else 'none'} where the "
                f"ratios of {base.method} say {end if end is not None else 'none'}: {_why_apart(base, exact[0])}")  # fmt: skip
            # the length shown is the one the run whose accuracy stands beside it had
            found[base.seed] = DeltaSource(own, max(fedrema_records(exact[0]), default=last), exact[0], note)
        elif end is None:
            found[base.seed] = DeltaSource(end, last, base, f"= {base.method} (the CCP does not end within the run)")
        else:
            twins = [r for r, _ in same_seed if ccp_end_round(r) == end]
            note = f"= {twins[0].method} (its CCP ended in the same round)" if twins else "no run ends its CCP in that round"
            found[base.seed] = DeltaSource(end, last, twins[0] if twins else None, note)
    return found


def _why_apart(a: Run, b: Run) -> str:
    """Why two runs that should be the same up to the CCP's end are not."""
    ca, cb = run_capability(a.summary or {}), run_capability(b.summary or {})
    if ca and cb and (ca != cb or ", then " in ca):
        # PyTorch picks its kernels by the CPU's instruction set, and their float rounding differs
        return (f"the runs were made on CPUs of different capability ({ca} and {cb}), whose floating-point "
                "rounding differs from round 1, so their ratios differ slightly and can cross δ in different rounds")  # fmt: skip
    return "the runs are not the same up to the end"


def final_rounds_cell(runs: list[Run], k: int) -> Cell:
    """Per run, the mean personalised accuracy of its evaluations in its final ``k`` rounds (from
    ``metrics.jsonl``: FedReMa's Table 3 "Final Acc" is the mean of the last 5 rounds)."""
    out = Cell()
    for run in runs:
        rows = [r for r in run.evaluations() if math.isfinite(r["personalized_acc"])]
        if not rows:
            continue
        last = max(r["round"] for r in rows)
        out.values.append(statistics.fmean(r["personalized_acc"] for r in rows if r["round"] > last - k))
        out.seeds.append(run.seed)
    return out


def delta_table(col: Collection, deltas: Sequence[float] = PAPER_DELTAS) -> str | None:
    """FedReMa's Table 3 analogue per setting: for each δ the CCP's length, the accuracy (best
    round, final round, mean of the last 10) and the server's seconds, from the run that stands for
    that δ (:func:`delta_sources`), so a δ whose run repeats another's needs no run of its own.
    None when the collection has no MDS-every-round FedReMa run."""
    rows = []
    for s in col.settings:
        for d in deltas:
            sources = delta_sources(col, s, d)
            if not sources:
                continue
            seeds = sorted(sources, key=lambda k: (k is None, k))
            lengths = ", ".join(str(sources[k].end) if sources[k].end is not None else f"> {sources[k].last}" for k in seeds)
            runs = [sources[k].run for k in seeds if sources[k].run is not None]
            server = [((r.summary or {}).get("time_s") or {}).get("server") for r in runs]
            server = [float(v) for v in server if isinstance(v, (int, float))]
            notes = "; ".join(f"seed {k}: {sources[k].note}" for k in seeds)
            rows.append(
                [s, f"{d:g}", lengths]
                + [format_cell(cell(runs, which)) for which in ("best", "final")]
                + [format_cell(final_rounds_cell(runs, 5)), format_cell(cell(runs, "last10"))]
                + [f"{statistics.fmean(server):.1f}" if server else DASH, notes]
            )
    if not rows:
        return None
    header = [
        "setting", "δ", "CCP rounds (per seed)", "best round (%)", "final round (%)",
        "last 5 rounds (%), the paper's Final Acc", "last 10 (%)", "server s / run", "numbers from",
    ]  # fmt: skip
    return markdown_table(header, rows)


def ccp_table(col: Collection) -> str | None:
    """Methods with FedReMa records × settings: the CCP's length; None when no method has them."""
    cells = {(m, s): ccp_text(col.finished(s, m)) for m in col.methods for s in col.settings}
    methods = [m for m in col.methods if any(cells[m, s] is not None for s in col.settings)]
    if not methods:
        return None
    rows = [[m] + [cells[m, s] or DASH for s in col.settings] for m in methods]
    return markdown_table(["method"] + list(col.settings), rows)


# ---------------------------------------------------------------------------------------------
# FedAC's G_c (its Fig. 4(c), 4(d))


def gc_series(rows: list[dict[str, Any]]) -> list[tuple[int, list[float]]]:
    """(round, every cluster's G_c) of each round whose ``clustering`` record has G_c (FedAC)."""
    out = []
    for row in rows:
        for entry in row.get("rounds_log") or []:
            rec = entry.get("clustering") if isinstance(entry, dict) else None
            gc = rec.get("gc") if isinstance(rec, dict) else None
            if isinstance(gc, list) and isinstance(entry.get("round"), int):
                values = [float(g) for g in gc if _number(g) is not None and math.isfinite(float(g))]
                out.append((entry["round"], values))
    return sorted(out)


def gc_band(config: dict[str, Any] | None) -> tuple[float, float] | None:
    """CNT's band (gc_low, gc_high) of a FedAC run with cluster-number tuning on; None otherwise."""
    if not config or config.get("algorithm") != "fedac":
        return None
    options = _effective_options(config)
    return (float(options["gc_low"]), float(options["gc_high"])) if options.get("cnt") else None


def plot_gc_rounds(rows: list[dict[str, Any]], path: Path, low: float, high: float, title: str = "") -> bool:
    """Every cluster's G_c against the round, with CNT's band (low, high) (FedAC's Fig. 4(d)); False
    without G_c records."""
    import matplotlib.pyplot as plt

    series = gc_series(rows)
    if not any(values for _, values in series):
        return False
    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=110)
    xs = [r for r, values in series for _ in values]
    ys = [g for _, values in series for g in values]
    ax.scatter(xs, ys, s=4, alpha=0.5, color="tab:blue", label="G_c of a cluster")
    means = [(r, statistics.fmean(values)) for r, values in series if values]
    ax.plot([r for r, _ in means], [m for _, m in means], color="black", linewidth=0.8, label="mean over clusters")
    for bound in (low, high):
        ax.axhline(bound, color="tab:red", linestyle="--", linewidth=0.8)
    counts = ax.twinx()
    counts.step([r for r, _ in series], [len(v) for _, v in series], where="post", color="tab:green", linewidth=0.8)
    counts.set_ylabel("clusters", color="tab:green", fontsize=8)
    ax.set_xlabel("round", fontsize=8)
    ax.set_ylabel("G_c", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title or f"G_c per round; CNT keeps it in ({low:g}, {high:g})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def gc_by_k(col: Collection, last: float = 0.1) -> dict[str, list[tuple[int, float, float]]]:
    """Per setting: (K, mean, std) of the clusters' G_c over the final ``last`` share of the rounds of
    FedAC's runs with a fixed number of clusters (cnt = false), every seed pooled (its Fig. 4(c))."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for s in col.settings:
        by_k: dict[int, list[float]] = {}
        for m in col.methods:
            for run in col.finished(s, m):
                config = run.config or {}
                options = _effective_options(config)
                if config.get("algorithm") != "fedac" or options.get("cnt", True):
                    continue
                series = gc_series(run.metrics())
                if not series:
                    continue
                start = series[-1][0] * (1 - last)
                by_k.setdefault(int(options.get("num_clusters", 4)), []).extend(
                    g for r, values in series if r > start for g in values)  # fmt: skip
        points = [(k, statistics.fmean(v), statistics.pstdev(v)) for k, v in sorted(by_k.items()) if v]
        if len(points) >= 2:
            out[s] = points
    return out


def plot_gc_by_k(col: Collection, path: Path) -> bool:
    """Mean ± std of G_c against the preset K (cluster-number tuning off), one line per setting."""
    import matplotlib.pyplot as plt

    data = gc_by_k(col)
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(5.6, 3.6), dpi=110)
    for s, points in data.items():
        ax.errorbar([k for k, _, _ in points], [m for _, m, _ in points], yerr=[d for _, _, d in points],
                    marker="o", capsize=3, label=s)  # fmt: skip
    ax.set_xlabel("preset number of clusters K (cluster-number tuning off)", fontsize=8)
    ax.set_ylabel("G_c, final 10 % of rounds", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title("FedAC's G_c against K", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
