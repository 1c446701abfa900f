"""Numbers of ``fedtail report``: per-cell statistics, reference values, Markdown tables.

Cells aggregate the finished runs (seeds) of one (setting, method): the mean and the sample
standard deviation (n - 1 in the denominator; none for a single seed) of a summary value, in
percent with two decimals: ``85.01 ± 0.32 (2 seeds)``. A cell without finished runs is "—";
runs that diverged are never averaged in: the cell says ``diverged (round R)`` (after the mean of
the seeds that finished, if any).
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from fedtail.errors import ConfigError
from fedtail.machine import run_capability
from fedtail.report.collect import Collection, Run

DASH = "—"
METRICS = {
    "final": "Final-round personalised accuracy (%)",
    "best": "Best-round personalised accuracy (%)",
    "last10": "Personalised accuracy, mean over the final 10 rounds (%)",
}
# Stage-task runs (--partition stages): the GLDP paper's metrics, from summary.json → final.
STAGE_METRICS = {"a_local": "A_local", "a_global": "A_global", "a_part": "A_part"}
# Segmentation runs: MuPFL's Tables III–IV report mIoU and mAcc (fedtail.metrics.segmentation).
SEGMENTATION_METRICS = {"personalized_miou": "mIoU", "personalized_macc": "mAcc", "global_miou": "global mIoU"}


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)  # fractions in [0, 1]
    seeds: list[int | None] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 2 else None


def cell(runs: list[Run], which: str, key: str = "personalized_acc") -> Cell:
    """``which`` is "final", "best" or "last10": that entry of each run's summary.json; ``key`` its value."""
    out = Cell()
    for run in runs:
        entry = (run.summary or {}).get(which) or {}
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.values.append(float(value))
            out.seeds.append(run.seed)
            if isinstance(entry.get("round"), int):
                out.rounds.append(entry["round"])
    return out


def format_cell(c: Cell, show_rounds: bool = False) -> str:
    if not c.n:
        return DASH
    text = f"{100 * c.mean:.2f}"
    if c.std is not None:
        text += f" ± {100 * c.std:.2f}"
    text += f" ({c.n} seed{'s' if c.n != 1 else ''})"
    if show_rounds and c.rounds:
        lo, hi = min(c.rounds), max(c.rounds)
        text += f" @ r{lo}" if lo == hi else f" @ r{lo}–{hi}"
    return text


def cell_text(
    col: Collection, setting: str, method: str, which: str, key: str = "personalized_acc", runs: list[Run] | None = None
) -> str:
    """The table cell of (setting, method): the finished seeds' statistic (of ``runs`` where given,
    runs that stand for the method's), and the diverged runs."""
    runs = col.finished(setting, method) if runs is None else runs
    text = format_cell(cell(runs, which, key), show_rounds=which == "best" and key == "personalized_acc")
    rounds = sorted(r.diverged for r in col.diverged(setting, method))
    if not rounds:
        return text
    where = ", ".join(f"round {r}" for r in rounds)
    note = f"diverged ({where})" if len(rounds) == 1 else f"{len(rounds)} diverged ({where})"
    return note if text == DASH else f"{text}; {note}"


# ---------------------------------------------------------------------------------------------
# Reference (paper) numbers


@dataclass
class Reference:
    values: dict[str, dict[str, float]]  # setting -> method -> percent
    source: str | None = None
    metric: str = "both"  # which table(s) the numbers sit beside: final | best | last10 | both (final, best)
    # sweep file stem -> setting -> method -> percent: where one sweep file's section (e.g. an
    # ablation table) has its own number for a method that another section shares
    sections: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # setting -> method -> {key: percent}: beside the stage-task tables (STAGE_METRICS keys, from the
    # file's [stages] tables) and the segmentation tables (SEGMENTATION_METRICS keys, [segmentation])
    stages: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    label: str = "paper"  # the columns' mark, e.g. "paper, CIFAR-10" when the paper's data differ

    def get(self, setting: str, method: str) -> float | None:
        return self.values.get(setting, {}).get(method)

    def get_stage(self, setting: str, method: str, key: str) -> float | None:
        return self.stages.get(setting, {}).get(method, {}).get(key)

    def has_stage(self, setting: str, key: str) -> bool:
        return any(key in per_method for per_method in self.stages.get(setting, {}).values())

    def applies(self, which: str) -> bool:
        return self.metric == which or (self.metric == "both" and which in ("final", "best"))

    def for_section(self, stem: str) -> "Reference":
        """The numbers of the sweep file ``stem``'s section: ``[sections.STEM.SETTING]`` over the rest."""
        override = self.sections.get(stem)
        if not override:
            return self
        values = {s: dict(m) for s, m in self.values.items()}
        for setting, methods in override.items():
            values.setdefault(setting, {}).update(methods)
        return Reference(values, self.source, self.metric, stages=self.stages, label=self.label)


REFERENCE_KEYS = ("reference", "sections", "stages", "segmentation", "source", "metric", "label")


def _percentages(path: Path, where: str, table: Any) -> dict[str, dict[str, float]]:
    """``{SETTING: {METHOD: percent}}`` from the TOML table at ``where``, validated."""
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"--reference {path}: expected [{where}.SETTING] tables of METHOD = percent")
    values: dict[str, dict[str, float]] = {}
    for setting, methods in table.items():
        if not isinstance(methods, dict):
            raise ConfigError(f"--reference {path}: {where}.{setting} must be a table of METHOD = percent")
        for method, value in methods.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise ConfigError(
                    f"--reference {path}: {where}.{setting}.{method} must be a percentage in [0, 100] (got {value!r})"
                )
            values.setdefault(str(setting), {})[str(method)] = float(value)
    return values


def load_reference(path: Path) -> Reference:
    """REF.toml: ``[reference.SETTING] METHOD = percent``; optional ``source``, ``metric`` and
    ``[sections.SWEEP_FILE_STEM.SETTING] METHOD = percent`` (that sweep file's section only)."""
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--reference: no such file {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--reference {path}: not valid TOML ({err})") from None
    unknown = sorted(set(raw) - set(REFERENCE_KEYS))
    if unknown:
        raise ConfigError(f"--reference {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REFERENCE_KEYS)}")
    stages = _stage_percentages(path, raw.get("stages", {}))
    for setting, methods in _stage_percentages(path, raw.get("segmentation", {}), "segmentation", SEGMENTATION_METRICS).items():
        for method, values in methods.items():
            stages.setdefault(setting, {}).setdefault(method, {}).update(values)
    values = _percentages(path, "reference", raw.get("reference")) if "reference" in raw or not stages else {}
    sections_raw = raw.get("sections", {})
    if not isinstance(sections_raw, dict):
        raise ConfigError(f"--reference {path}: sections must be [sections.SWEEP_FILE_STEM.SETTING] tables")
    sections = {str(stem): _percentages(path, f"sections.{stem}", t) for stem, t in sections_raw.items()}
    metric = raw.get("metric", "both")
    if metric not in ("final", "best", "last10", "both"):
        raise ConfigError(f"--reference {path}: metric must be final, best, last10 or both (got {metric!r})")
    source = raw.get("source")
    label = raw.get("label", "paper")
    if not isinstance(label, str) or not label.strip():
        raise ConfigError(f"--reference {path}: label must be a non-empty string (got {label!r})")
    return Reference(values, str(source) if source is not None else None, metric, sections, stages, label.strip())


def _stage_percentages(
    path: Path, table: Any, name: str = "stages", allowed: dict[str, str] = STAGE_METRICS
) -> dict[str, dict[str, dict[str, float]]]:
    """``[stages.SETTING.METHOD] a_local = percent`` (and a_global, a_part), or the same under
    ``[segmentation.…]`` with :data:`SEGMENTATION_METRICS` keys, validated."""
    if not isinstance(table, dict):
        raise ConfigError(f"--reference {path}: {name} must be [{name}.SETTING.METHOD] tables")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for setting, methods in table.items():
        if not isinstance(methods, dict):
            raise ConfigError(f"--reference {path}: {name}.{setting} must hold [{name}.{setting}.METHOD] tables")
        for method, values in methods.items():
            if not isinstance(values, dict) or not values:
                raise ConfigError(
                    f"--reference {path}: {name}.{setting}.{method} must be a table of "
                    f"{' / '.join(allowed)} = percent"
                )
            for key, value in values.items():
                if key not in allowed:
                    raise ConfigError(
                        f"--reference {path}: {name}.{setting}.{method}.{key}: unknown; use {', '.join(allowed)}"
                    )
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                    raise ConfigError(
                        f"--reference {path}: {name}.{setting}.{method}.{key} must be a percentage in [0, 100] "
                        f"(got {value!r})"
                    )
                out.setdefault(str(setting), {}).setdefault(str(method), {})[key] = float(value)
    return out


# ---------------------------------------------------------------------------------------------
# Markdown


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---:" if a == "c" else "---" for a in align]
    lines = ["| " + " | ".join(_escape(h) for h in header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def accuracy_table(col: Collection, which: str, reference: Reference | None = None) -> str:
    """Rows = methods, columns = settings (+ a paper column per setting the reference covers)."""
    use_ref = reference is not None and reference.applies(which)
    header = ["method"]
    for s in col.settings:
        header.append(s)
        if use_ref and s in reference.values:  # type: ignore[union-attr]
            header.append(f"{s} ({reference.label})")  # type: ignore[union-attr]
    rows = []
    for m in col.methods:
        row = [m]
        for s in col.settings:
            row.append(cell_text(col, s, m, which))
            if use_ref and s in reference.values:  # type: ignore[union-attr]
                ref = reference.get(s, m)  # type: ignore[union-attr]
                row.append(DASH if ref is None else f"{ref:.2f}")
        rows.append(row)
    return markdown_table(header, rows)


def has_stage_metrics(col: Collection) -> bool:
    """Whether some finished run is a stage-task run (its summary has A_local)."""
    return any("a_local" in ((r.summary or {}).get("final") or {}) for r in col.runs if r.finished)


def has_segmentation_metrics(col: Collection) -> bool:
    """Whether some finished run is a segmentation run (its summary has mIoU)."""
    return any("personalized_miou" in ((r.summary or {}).get("final") or {}) for r in col.runs if r.finished)


def segmentation_table(col: Collection, which: str = "final", reference: Reference | None = None) -> str:
    """mIoU / mAcc / global mIoU of ``which``, as :func:`stage_table` lays out the stage metrics."""
    return stage_table(col, which, reference, SEGMENTATION_METRICS)


# Every segmentation value of summary.json by name (fedtail.metrics.segmentation), a table each view.
SEGMENTATION_DETAIL = {
    "personalised": {
        "personalized_acc": "pixel acc",
        "personalized_miou": "mIoU",
        "personalized_miou_weighted": "pooled mIoU",
        "personalized_macc": "mAcc",
        "personalized_macc_weighted": "pooled mAcc",
        "head_iou": "head IoU",
        "middle_iou": "middle IoU",
        "tail_iou": "tail IoU",
    },
    "global": {
        "global_acc": "pixel acc",
        "global_miou": "mIoU",
        "global_macc": "mAcc",
        "global_head_iou": "head IoU",
        "global_middle_iou": "middle IoU",
        "global_tail_iou": "tail IoU",
    },
}


def _mean_text(c: Cell) -> str:
    if not c.n:
        return DASH
    return f"{100 * c.mean:.2f}" + (f" ± {100 * c.std:.2f}" if c.std is not None else "")


def _segmentation_cells(col: Collection) -> list[tuple[str, str, list[Run]]]:
    """(setting, method, finished segmentation runs) of every cell that has some."""
    out = []
    for s in col.settings:
        for m in col.methods:
            runs = [r for r in col.finished(s, m) if "personalized_miou" in ((r.summary or {}).get("final") or {})]
            if runs:
                out.append((s, m, runs))
    return out


def segmentation_detail_table(col: Collection, view: str, which: str = "final") -> str:
    """Rows = (setting, method) of the segmentation runs, columns = every value of ``view``
    (:data:`SEGMENTATION_DETAIL`) of summary.json's ``which``: mean ± std over the seeds, in percent."""
    metrics = SEGMENTATION_DETAIL[view]
    header = ["setting", "method", "seeds"] + list(metrics.values())
    rows = []
    for s, m, runs in _segmentation_cells(col):
        cells = [cell(runs, which, key) for key in metrics]
        if view == "global" and not any(c.n for c in cells[1:]):
            continue  # no global model (personalised-only methods, or eval_global off)
        rows.append([s, m, str(len(runs))] + [_mean_text(c) for c in cells])
    return markdown_table(header, rows, ["l", "l", "r"] + ["r"] * len(metrics)) if rows else ""


def per_class_iou_table(col: Collection, class_names: Sequence[str] = ()) -> str:
    """Rows = (setting, method), columns = classes: the pooled personalised IoU of each class
    (``per_class_iou`` of the run's last evaluation in metrics.jsonl), mean over the seeds; "—"
    where no client's ground truth holds the class."""
    cells = _segmentation_cells(col)
    per_run = {}
    width = 0
    for _, _, runs in cells:
        for r in runs:
            rows = [row for row in r.metrics() if isinstance(row.get("per_class_iou"), list)]
            if rows:
                per_run[r.dir] = rows[-1]["per_class_iou"]
                width = max(width, len(per_run[r.dir]))
    if not width:
        return ""
    names = [class_names[c] if c < len(class_names) else f"class {c}" for c in range(width)]
    body = []
    for s, m, runs in cells:
        values = [per_run[r.dir] for r in runs if r.dir in per_run]
        if not values:
            continue
        row = [s, m, str(len(values))]
        for c in range(width):
            got = [v[c] for v in values if c < len(v) and isinstance(v[c], (int, float))]
            row.append(f"{100 * statistics.fmean(got):.2f}" if got else DASH)
        body.append(row)
    return markdown_table(["setting", "method", "seeds"] + names, body, ["l", "l", "r"] + ["r"] * width)


def stage_table(
    col: Collection, which: str = "final", reference: Reference | None = None, metrics: dict[str, str] = STAGE_METRICS
) -> str:
    """A_local / A_global / A_part (or other ``metrics`` of summary.json) of ``which`` (final or last10):
    rows = methods, a column per metric and setting, each followed by a reference column where
    ``reference`` has numbers for it."""
    use_ref = reference is not None and reference.applies(which)
    columns = [
        (s, key, ref)
        for s in col.settings
        for key in metrics
        for ref in ((False, True) if use_ref and reference.has_stage(s, key) else (False,))  # type: ignore[union-attr]
    ]
    header = ["method"] + [
        f"{s} {metrics[key]}" + (f" ({reference.label})" if ref else "")  # type: ignore[union-attr]
        for s, key, ref in columns
    ]
    rows = []
    for m in col.methods:
        row = [m]
        for s, key, ref in columns:
            if ref:
                value = reference.get_stage(s, m, key)  # type: ignore[union-attr]
                row.append(DASH if value is None else f"{value:.2f}")
            else:
                row.append(cell_text(col, s, m, which, key))
        rows.append(row)
    return markdown_table(header, rows)


def unused_reference(col: Collection, reference: Reference) -> list[str]:
    out = []
    for table in (reference.values, reference.stages):
        for s, methods in table.items():
            for m in methods:
                if (s not in col.settings or m not in col.methods) and f"{s} / {m}" not in out:
                    out.append(f"{s} / {m}")
    return out


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def costs_table(col: Collection) -> str:
    """Wall minutes per run and seconds per round, server seconds per run and MB (10^6 bytes) per
    round up / down / edge→server, mean over seeds (named accuracies are views of other runs: no rows of their own).

    Server seconds (``summary.json``'s ``time_s.server``: the server half's own work, clients'
    training excluded) show what a server-side step costs (FedReMa's MDS, a clustering) where the
    wall time of runs that shared the cores with other runs mostly measures the load."""
    groups = [(m, s, col.finished(s, m)) for m in col.methods for s in col.settings]
    return costs_table_of([(m, s, runs) for m, s, runs in groups if not any(r.named for r in runs)])


def costs_table_of(groups: list[tuple[str, str, list[Run]]]) -> str:
    """:func:`costs_table` over explicit (method, setting, finished runs) rows, in the given order.

    A report over several sweep files passes its distinct cells here, so a run that several
    sweeps plan is costed once.
    """
    header = ["method", "setting", "runs", "wall min / run", "wall s / round", "server s / run", "MB up / round",
              "MB down / round", "MB edge→server / round", "CPU"]  # fmt: skip
    rows = []
    total_min, total_runs = 0.0, 0
    for m, s, runs in groups:
        if not runs:
            continue
        wall: list[float] = []
        wall_round: list[float] = []  # runtime per round: compares runs of different lengths
        server: list[float] = []
        per_round: dict[str, list[float]] = {"up": [], "down": [], "edge_up": []}
        for run in runs:
            summary: dict[str, Any] = run.summary or {}
            if isinstance(summary.get("wall_time_s"), (int, float)):
                wall.append(summary["wall_time_s"] / 60)
            times = summary.get("time_s") or {}
            if isinstance(times, dict) and isinstance(times.get("server"), (int, float)):
                server.append(times["server"])
            rounds = summary.get("rounds")
            if isinstance(summary.get("wall_time_s"), (int, float)) and isinstance(rounds, int) and rounds > 0:
                wall_round.append(summary["wall_time_s"] / rounds)
            traffic = summary.get("bytes") or {}
            for key in per_round:
                if isinstance(traffic.get(key), (int, float)) and isinstance(rounds, int) and rounds > 0:
                    per_round[key].append(traffic[key] / rounds / 1e6)
        total_min += sum(wall)
        total_runs += len(wall)
        fmt = lambda v, d=2: DASH if v is None else f"{v:.{d}f}"  # noqa: E731
        rows.append(
            [m, s, str(len(runs)), fmt(_mean(wall), 2), fmt(_mean(wall_round), 2), fmt(_mean(server), 1)]
            + [fmt(_mean(per_round[k]), 3) for k in ("up", "down", "edge_up")]
            + [_cpus(runs)]
        )
    if not rows:
        return "_No finished runs._"
    table = markdown_table(header, rows, ["l", "l", "r", "r", "r", "r", "r", "r", "r", "l"])
    # the sum a compute budget is checked against (runs sharing the cores each count their own wall time)
    return table + f"\n\nIn total {total_runs} timed runs, {total_min / 60:.1f} h of wall time (the sum over runs)."


def _cpus(runs: list[Run]) -> str:
    """The instruction sets the runs ran on, with counts ("AVX2 ×2, AVX512"): wall times compare
    only between runs of one set (the same work takes up to twice as long without AVX-512)."""
    counts: dict[str, int] = {}
    for run in runs:
        cap = run_capability(run.summary or {}) or "?"
        counts[cap] = counts.get(cap, 0) + 1
    if set(counts) == {"?"}:
        return DASH
    return ", ".join(cap if n == 1 else f"{cap} ×{n}" for cap, n in sorted(counts.items()))


def incomplete_cells(col: Collection) -> list[str]:
    """Cells with fewer finished seeds than planned (by sweep.json, else every seed seen)."""
    # cells a sweep planned expect the planned seeds; any other cell every seed of such runs
    seen = {r.seed for r in col.runs if r.seed is not None and (r.setting, r.method) not in col.expected}
    lines = []
    derived = {r.method for r in col.runs if r.named}  # named accuracies: their run's cell says it
    for m in col.methods:
        if m in derived:
            continue
        for s in col.settings:
            done = {r.seed for r in col.finished(s, m)}
            expected = col.expected.get((s, m)) or seen
            missing = sorted(x for x in expected if x not in done)
            if not missing and done:
                continue
            unfinished = {r.seed: r for r in col.unfinished(s, m)}
            why = []
            for seed in missing:
                run = unfinished.get(seed)
                state = "stale" if run is not None and run.stale else "diverged" if run and run.diverged is not None else "unfinished"
                why.append(f"seed {seed}: " + (f"{state} ({run.problem}) in {run.dir}" if run else "no run folder"))
            n_expected = len(expected | done)
            lines.append(f"`{s}` / `{m}`: {len(done)} of {n_expected} seeds finished" + ("; " + "; ".join(why) if why else ""))
    return lines


def honest_cell(runs: list[Run]) -> Cell:
    """The final personalised accuracy over the clients that are not hostile (``summary.json`` →
    ``byzantine.clients``), equal weight per client as ``personalized_acc``, from the final round's
    ``per_client_acc`` in ``metrics.jsonl``; a run without that row adds nothing."""
    out = Cell()
    for run in runs:
        summary = run.summary or {}
        final_round = (summary.get("final") or {}).get("round")
        hostile = set((summary.get("byzantine") or {}).get("clients") or [])
        row = next((r for r in reversed(run.metrics()) if r.get("round") == final_round and r.get("per_client_acc")), None)
        if row is None:
            continue
        accs = [a for i, a in enumerate(row["per_client_acc"]) if i not in hostile and isinstance(a, (int, float))]
        if accs and all(math.isfinite(a) for a in accs):
            out.values.append(sum(accs) / len(accs))
            out.seeds.append(run.seed)
    return out


def guard_table(col: Collection) -> str | None:
    """Methods × settings of runs with client-level DP, hostile clients or a robust rule (config →
    ``privacy``, ``faults``; ``summary.json`` → ``privacy.epsilon``): the rule, the hostile clients,
    z, C, ε at δ, and the final personalised accuracy over all clients and over the honest ones
    (:func:`honest_cell`) and the global accuracy, mean over seeds (diverged runs counted apart);
    None without such runs."""
    rows = []
    for m in col.methods:
        for s in col.settings:
            runs, diverged = col.finished(s, m), col.diverged(s, m)
            config = ((runs or diverged)[0].config or {}) if runs or diverged else {}
            faults, privacy = config.get("faults") or {}, config.get("privacy") or {}
            rule, hostile = faults.get("aggregate", "mean"), faults.get("byzantine", 0)
            if not privacy and not hostile and rule == "mean":
                continue
            eps = [((r.summary or {}).get("privacy") or {}).get("epsilon") for r in runs]
            eps = [e for e in eps if isinstance(e, (int, float))]
            z = privacy.get("noise")
            shown_eps = f"{_mean(eps):.3g}" if eps else ("∞" if z == 0 else DASH)
            if privacy and z is None:
                z = ((runs[0].summary or {}).get("privacy") or {}).get("noise_multiplier") if runs else None
            fmt = lambda v: DASH if v is None else f"{v:g}"  # noqa: E731
            rows.append([
                m, s, rule, f"{hostile} ({faults.get('byzantine_mode', 'sign-flip')})" if hostile else "0",
                fmt(z) if privacy else DASH, fmt(privacy.get("clip")) if privacy else DASH,
                shown_eps if privacy else DASH, fmt(privacy.get("delta", 1e-5)) if privacy else DASH,
                format_cell(cell(runs, "final")) + (f"; diverged ×{len(diverged)} (round {min(r.diverged for r in diverged)})" if diverged else ""),
                format_cell(honest_cell(runs)) if hostile else DASH,
                format_cell(cell(runs, "final", "global_acc")),
            ])  # fmt: skip
    if not rows:
        return None
    header = ["method", "setting", "aggregate", "hostile clients", "z", "C", "ε", "δ", "final personalised",
              "final personalised, honest clients", "final global"]  # fmt: skip
    return markdown_table(header, rows, ["l", "l", "l", "l", "r", "r", "r", "r", "r", "r", "r"])
