"""``fedtail report --sweep FILE ...``: one Markdown document with one section per sweep file.

A section's tables hold exactly the runs its sweep file plans (``{out}/{setting}/{method}/seed{k}``
for the file's settings, methods and seeds, in file order), so a run folder that several sweep
files plan (they may share ``out``) appears in every one of their sections. A planned folder
counts when it holds a finished run whose ``config.json`` is the planned config (the test of
``fedtail sweep``: a *stale* run answers another question and is listed, not tabulated). The
``sweep.json`` of ``out`` is read only for what it alone knows: the machine and the times. It
describes whichever sweep ran last in that folder, so it does not give the plan.

The document has one header, then per file its tables (with ``rounds_to`` levels also the rounds
to reach them; sensitivity curves where methods differ in one option, see
:mod:`fedtail.report.analyses`), incomplete cells and figures (accuracy vs round, sensitivity,
clusters per round, and cluster scatters not already shown by an earlier section), then one
costs table in which every distinct run counts once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from fedtail.errors import FedtailError
from fedtail.report.blocks import (
    GENERATED,
    Figure,
    accuracy_blocks,
    ccp_block,
    guard_block,
    cells_note,
    code_line,
    machines_line,
    collection_figures,
    costs_block,
    eval_splits,
    figures_block,
    header_lines,
    incomplete_block,
    clients_to_block,
    rounds_to_block,
    sensitivity_block,
    slug,
    warnings_block,
)
from fedtail.report.analyses import ClientsTo, sensitivity_groups, stop_notes
from fedtail.report.collect import Collection, Run, load_run, with_named
from fedtail.report.document import ReportResult, check_inputs
from fedtail.report.tables import Reference, costs_table_of
from fedtail.sweep.spec import Sweep, load_sweep
from fedtail.sweep.status import run_status


@dataclass
class Section:
    file: Path
    name: str  # the heading
    sweep: Sweep
    col: Collection  # the planned runs; settings and methods in file order
    record: dict[str, Any] | None  # {out}/sweep.json with "root", if readable

    @property
    def command(self) -> str:
        return f"fedtail sweep {self.file}"


def sweep_title(path: Path) -> str:
    """The first sentence of the file's leading comment block, else the file name.

    A long comment wraps, so the sentence is read across the lines of the block's first paragraph
    (up to an empty ``#`` line, a blank line or the first key).
    """
    words: list[str] = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text.startswith("#"):
            if words or text:
                break  # a comment after the first key describes that key, not the sweep
            continue
        text = text.lstrip("#").strip()
        if not text:
            if words:
                break  # the first paragraph ends
            continue
        words.append(text)
    if not words:
        return path.name
    # a sentence ends at ". " before a capital letter, perhaps behind "(" (so "e.g. x" or "0.5, 1"
    # do not end one)
    return re.split(r"(?<=\.)\s+(?=\(?[A-Z])", " ".join(words), maxsplit=1)[0]


def load_section(path: Path, cache: dict[Path, Run | None], warnings: list[str]) -> Section:
    """Plan the sweep file (raises ConfigError as ``fedtail sweep`` would) and read its run folders.

    ``cache`` (resolved folder -> run) lets sections that share a folder read it once.
    """
    sweep = load_sweep(path)
    runs: list[Run] = []
    expected: dict[tuple[str, str], set[int]] = {}
    for planned in sweep.runs:
        expected.setdefault((planned.setting, planned.method), set()).add(planned.seed)
        key = planned.dir.resolve()
        if key not in cache:
            found = load_run(planned.dir, warnings) if planned.dir.is_dir() else None
            if found is not None and found.summary is not None:
                found.metrics()  # read once: the per-section copies below share the rows
            cache[key] = found
        found = cache[key]
        if found is None:
            continue
        # the plan names the cell, whatever the folder's config says; staleness is per plan
        run = replace(found, setting=planned.setting, method=planned.method, seed=planned.seed, sweep_root=sweep.out)
        if run.summary is None:
            what = "diverged run; its cells say so" if run.diverged is not None else "unfinished run; not in the tables"
            warnings.append(f"{run.dir}: {what} ({run.problem})")
        else:
            status = run_status(planned)
            if status.state == "stale":
                run.stale, run.problem = True, status.note
                warnings.append(f"{run.dir}: {status.note}; not in the tables of {path}")
        runs.append(run)
    record = _record(sweep.out, warnings)
    methods = with_named(runs, list(sweep.methods), expected)
    col = Collection(runs, list(sweep.settings), methods, expected, [record] if record else [], [])
    return Section(path, sweep_title(path), sweep, col, record)


def _record(out: Path, warnings: list[str]) -> dict[str, Any] | None:
    path = out / "sweep.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        warnings.append(f"{path}: unreadable ({err}); the machine of the runs is not shown")
        return None
    if not isinstance(data, dict):
        warnings.append(f"{path}: not a JSON object; ignored")
        return None
    return data | {"root": str(out)}


class _FigureNames:
    """``STEM-WHAT.png`` beside the report, with ``-2``, ``-3`` ... when WHAT repeats."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.used: set[str] = set()

    def take(self, what: str) -> Path:
        name, k = f"{self.out.stem}-{what}", 1
        while name in self.used:
            k += 1
            name = f"{self.out.stem}-{what}-{k}"
        self.used.add(name)
        return self.out.with_name(name + ".png")


def write_sweep_report(
    files: list[Path],
    out: Path,
    *,
    report_command: str,
    reference_path: Path | None = None,
    title: str | None = None,
    command: str | None = None,
    rounds_to: Sequence[float] = (),
    clients_to: Sequence[ClientsTo] = (),
) -> ReportResult:
    """Write ``out`` (Markdown, one section per sweep file) and its PNG figures; FedtailError on bad input.

    ``rounds_to``: accuracy levels (percent) for a table of the rounds each method needs to reach them;
    ``clients_to``: (level, client counts) for a table of the seconds until that many clients reach it."""
    rounds_to, reference = check_inputs(out, reference_path, rounds_to)
    seen: set[Path] = set()
    for f in files:
        if f.resolve() in seen:
            raise FedtailError(f"--sweep {f}: given twice; give each sweep file once")
        seen.add(f.resolve())
    warnings: list[str] = []
    cache: dict[Path, Run | None] = {}
    sections = [load_section(f, cache, warnings) for f in files]
    warnings += stop_notes([run for run in cache.values() if run is not None])  # each run once
    warnings = list(dict.fromkeys(warnings))  # a shared folder warns once
    out.parent.mkdir(parents=True, exist_ok=True)

    names = _FigureNames(out)
    shown: dict[Path, str] = {}  # resolved run folder -> heading of the section showing its ACMU scatter
    per_section: list[tuple[list[Figure], list[str]]] = []
    for sec in sections:
        stem = slug(sec.file.stem)
        per_section.append(
            collection_figures(
                sec.col, sensitivity_groups(sec.col), lambda what: names.take(f"{what}-{stem}"), names.take, shown, sec.name
            )
        )

    text = _markdown(sections, per_section, reference, out, title, command, report_command, warnings, rounds_to,
                     clients_to)
    out.write_text(text)
    return ReportResult(out, plots=[p for figs, _ in per_section for _, p in figs], warnings=warnings)


def _markdown(
    sections: list[Section],
    per_section: list[tuple[list[Figure], list[str]]],
    reference: Reference | None,
    out: Path,
    title: str | None,
    command: str | None,
    report_command: str,
    warnings: list[str],
    rounds_to: Sequence[float] = (),
    clients_to: Sequence[ClientsTo] = (),
) -> str:
    records = list({Path(r["root"]).resolve(): r for sec in sections if (r := sec.record)}.values())
    outs = list(dict.fromkeys(str(sec.sweep.out) for sec in sections))
    planned = {r.dir.resolve() for sec in sections for r in sec.sweep.runs}
    finished = {r.dir.resolve() for sec in sections for r in sec.col.runs if r.finished}
    produced = [f"`{command}`"] if command else [f"`{sec.command}`" for sec in sections]

    md: list[str] = [f"# {title or 'fedtail report'}", "", GENERATED, ""]
    md += header_lines(produced, report_command, records)
    summaries = {r.dir.resolve(): r.summary for sec in sections for r in sec.col.runs if r.finished and r.summary}
    md.append(code_line(list(summaries.values())))
    md.append(machines_line(list(summaries.values())))
    md.append(f"- Sweep files: {', '.join(f'`{sec.file}`' for sec in sections)} (one section each)")
    md.append(f"- Run folders: {', '.join(f'`{o}`' for o in outs)}")
    md.append(
        f"- Runs: {len(finished)} of {len(planned)} planned runs finished "
        "(a run that several sweep files plan counts once)"
    )
    md.append("")
    md += cells_note(reference, eval_splits([r for sec in sections for r in sec.col.runs]))

    for sec, (figures, notes) in zip(sections, per_section):
        n_done = sum(r.finished and r.named is None for r in sec.col.runs)  # named accuracies: views of runs
        sw = sec.sweep
        md += [f"## {sec.name}", ""]
        md += [
            f"Sweep file `{sec.file}`, runs produced by `{sec.command}` into `{sw.out}`: {n_done} of "
            f"{len(sw.runs)} planned runs finished ({_count(sw.methods, 'method')} × "
            f"{_count(sw.settings, 'setting')} × {_seeds_text(sw)}).",
            "",
        ]
        md += accuracy_blocks(sec.col, reference.for_section(sec.file.stem) if reference else None, level=3)
        md += rounds_to_block(sec.col, rounds_to, level=3)
        md += clients_to_block(sec.col, clients_to, level=3)
        md += sensitivity_block(sec.col, sensitivity_groups(sec.col), level=3)
        md += ccp_block(sec.col, level=3)
        md += guard_block(sec.col, level=3)
        md += incomplete_block(sec.col, level=3)
        md += figures_block(figures, out, level=3, notes=notes)

    md += costs_block(_costs(sections), note=" Each run counts once, also when several sweep files plan it.")
    if reference is not None:
        unused = list(dict.fromkeys(
            f"{s} / {m}"
            for table in (reference.values, reference.stages)
            for s, methods in table.items()
            for m in methods
            if not any(s in sec.col.settings and m in sec.col.methods for sec in sections)
        ))  # fmt: skip
        stems = {sec.file.stem: sec for sec in sections}
        unused += [
            f"{stem}: {s} / {m}"
            for stem, per_setting in reference.sections.items()
            for s, methods in per_setting.items()
            for m in methods
            if stem not in stems or not (s in stems[stem].col.settings and m in stems[stem].col.methods)
        ]
        if unused:
            md += ["Reference numbers without a matching setting/method in these sweeps: " + ", ".join(unused), ""]
    md += warnings_block(warnings)
    return "\n".join(md).rstrip() + "\n"


def _seeds_text(sw: Sweep) -> str:
    """"2 seeds", or the seeds per method where methods have their own."""
    per_method = {m: sorted({r.seed for r in sw.runs if r.method == m}) for m in sw.methods}
    if len({tuple(v) for v in per_method.values()}) <= 1:
        return _count(sw.seeds, "seed")
    return "seeds per method: " + ", ".join(f"{m} {len(v)}" for m, v in per_method.items())


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''}"


def _costs(sections: list[Section]) -> str:
    """The costs table over the distinct runs of all sections (method-major, in first-seen order)."""
    several_outs = len({sec.sweep.out.resolve() for sec in sections}) > 1
    cells: dict[tuple[Path, str, str], dict[Path, Run]] = {}
    labels: dict[tuple[Path, str, str], str] = {}
    for sec in sections:
        for m in sec.col.methods:
            for s in sec.col.settings:
                key = (sec.sweep.out.resolve(), s, m)
                runs = cells.setdefault(key, {})
                for run in sec.col.finished(s, m):
                    if run.named is None:  # a named accuracy is a view of a run counted under its method
                        runs.setdefault(run.dir.resolve(), run)
                # with several run folders the same setting name may mean different runs
                labels[key] = f"{sec.sweep.out}/{s}" if several_outs else s
    groups = [
        (m, labels[(o, s, m)], sorted(runs.values(), key=lambda r: (r.seed or 0, str(r.dir))))
        for (o, s, m), runs in cells.items()
        if runs
    ]
    return costs_table_of(groups)
