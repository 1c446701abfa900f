"""``fedtail report RUN_DIRS``: one Markdown file (tables) plus PNG figures beside it, from run folders.

Everything in the tables is computed from ``summary.json`` files and every curve from
``metrics.jsonl``, so rerunning the command regenerates the report exactly (only the header's
date and machine lines describe the moment of generation). ``--sweep`` files instead give one
section per file: :mod:`fedtail.report.sweepdoc`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

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
    warnings_block,
)
from fedtail.report.analyses import ClientsTo, check_levels, sensitivity_groups, stop_notes
from fedtail.report.collect import Collection, collect
from fedtail.report.tables import Reference, costs_table, load_reference, unused_reference


@dataclass
class ReportResult:
    path: Path
    plots: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    collection: Collection | None = None  # RUN_DIRS mode only


def check_inputs(
    out: Path, reference_path: Path | None, rounds_to: Sequence[float]
) -> tuple[list[float], Reference | None]:
    """The checks every report writer makes before reading runs: the output's name, the accuracy
    levels and the paper's reference table. Returns the levels and the loaded reference."""
    if out.suffix.lower() != ".md":
        raise FedtailError(f"--out {out}: the report is Markdown; give a file name ending in .md")
    levels = check_levels(rounds_to) if rounds_to else []
    return levels, load_reference(reference_path) if reference_path else None


def write_report(
    paths: list[Path],
    out: Path,
    *,
    report_command: str,
    reference_path: Path | None = None,
    title: str | None = None,
    command: str | None = None,
    rounds_to: Sequence[float] = (),
    clients_to: Sequence[ClientsTo] = (),
) -> ReportResult:
    """Write ``out`` (Markdown) and its PNG figures; raises FedtailError on bad input.

    ``rounds_to``: accuracy levels (percent) for a table of the rounds each method needs to reach them;
    ``clients_to``: (level, client counts) for a table of the seconds until that many clients reach it."""
    rounds_to, reference = check_inputs(out, reference_path, rounds_to)
    col = collect(paths)
    if not col.runs and not col.expected:
        raise FedtailError(
            "report: no run folders (config.json / summary.json) under " + ", ".join(str(p) for p in paths)
        )
    result = ReportResult(out, warnings=list(col.warnings) + stop_notes(col.runs), collection=col)
    out.parent.mkdir(parents=True, exist_ok=True)

    groups = sensitivity_groups(col)
    figures, _ = collection_figures(
        col, groups, lambda what: out.with_name(f"{out.stem}-{what}.png"), lambda stem: out.with_name(f"{out.stem}-{stem}.png")
    )
    result.plots = [p for _, p in figures]

    analyses = rounds_to_block(col, rounds_to) + clients_to_block(col, clients_to) + sensitivity_block(col, groups)
    analyses += ccp_block(col)
    analyses += guard_block(col)
    text = _markdown(col, reference, paths, out, figures, title, command, report_command, result.warnings, analyses)
    out.write_text(text)
    return result


def _produced_by(col: Collection, command: str | None) -> list[str]:
    if command:
        return [f"`{command}`"]
    lines = []
    for sweep in col.sweeps:
        cmd = sweep.get("command") or f"fedtail sweep {sweep.get('file', '?')}"
        lines.append(f"`{cmd}` (sweep file `{sweep.get('file', '?')}`, plan in `{Path(sweep['root']) / 'sweep.json'}`)")
    return lines or ["not recorded (no sweep.json found; pass --command to state it)"]


def _markdown(
    col: Collection,
    reference: Reference | None,
    paths: list[Path],
    out: Path,
    figures: list[Figure],
    title: str | None,
    command: str | None,
    report_command: str,
    warnings: list[str],
    analyses: list[str],
) -> str:
    finished = [r for r in col.runs if r.finished and r.named is None]  # named accuracies: views of runs
    unfinished = [r for r in col.runs if not r.finished]
    md: list[str] = [f"# {title or 'fedtail report'}", "", GENERATED, ""]
    md += header_lines(_produced_by(col, command), report_command, col.sweeps)
    md.append(code_line([r.summary for r in finished if r.summary]))
    md.append(machines_line([r.summary for r in finished if r.summary]))
    md.append(f"- Run folders searched: {', '.join(f'`{p}`' for p in paths)}")
    md.append(
        f"- Runs: {len(finished)} finished, {len(unfinished)} unfinished; "
        f"{len(col.methods)} methods × {len(col.settings)} settings"
    )
    md.append("")
    md += cells_note(reference, eval_splits(col.runs))
    md += accuracy_blocks(col, reference)
    md += analyses
    md += costs_block(costs_table(col))
    md += incomplete_block(col)
    if reference is not None:
        unused = unused_reference(col, reference)
        if unused:
            md += ["Reference numbers without a matching setting/method in these runs: " + ", ".join(unused), ""]
    md += figures_block(figures, out)
    md += warnings_block(warnings)
    return "\n".join(md).rstrip() + "\n"
