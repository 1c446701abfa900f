"""benchmarks/PAPERS.md from benchmarks/papers.toml: every table and figure of the four papers and fedtail's status.

    python benchmarks/papers.py           # write benchmarks/PAPERS.md
    python benchmarks/papers.py --check   # exit 1 if PAPERS.md is stale or the table names a missing file

The test suite runs ``--check`` (tests/test_benchmark_files.py), so the document cannot drift from
papers.toml, name a file that does not exist, miss a table or figure sweep of a benchmark folder,
leave a runnable row without the command and the file that will show it, or say "not run yet" of
a row whose sweep has finished runs.
"""

from __future__ import annotations

import functools
import re
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "benchmarks" / "papers.toml"
TARGET = ROOT / "benchmarks" / "PAPERS.md"
PAPERS = {
    "mupfl": ("MuPFL", "Zhang et al., Multi-level Personalized Federated Learning on Heterogeneous and Long-Tailed Data (IEEE TMC 2024)", "benchmarks/mupfl"),
    "fedac": ("FedAC", "Zhang et al., FedAC: an adaptive clustered federated learning framework for heterogeneous data (2024)", "benchmarks/fedac"),
    "fedrema": ("FedReMa", "Liang et al., FedReMa: Improving Personalized Federated Learning via Leveraging the Most Relevant Clients (ECAI 2024)", "benchmarks/fedrema"),
    "gldp": ("GLDP", "Guo et al., STHFL: Spatio-Temporal Heterogeneous Federated Learning (2025), its GLDP framework", "benchmarks/gldp"),
}  # fmt: skip
STATUSES = ("reproduced", "partly", "runnable", "missing", "not-runnable", "illustration")
KEYS = {"item", "measures", "status", "differs", "command", "files"}


def load() -> dict[str, list[dict]]:
    data = tomllib.loads(SOURCE.read_text())
    unknown = set(data) - set(PAPERS)
    if unknown:
        raise ValueError(f"{SOURCE.name}: unknown paper(s) {sorted(unknown)}")
    return {paper: data.get(paper, []) for paper in PAPERS}


def problems(data: dict[str, list[dict]]) -> list[str]:
    """What is wrong with the table: bad keys or statuses, missing files, table sweeps not named."""
    out = []
    named = " ".join(row.get("command", "") for rows in data.values() for row in rows)
    for paper, rows in data.items():
        for row in rows:
            where = f"{paper} {row.get('item', '?')}"
            if set(row) - KEYS or not {"item", "measures", "status"} <= set(row):
                out.append(f"{where}: keys {sorted(row)}; allowed {sorted(KEYS)} (item, measures, status required)")
            if row.get("status") not in STATUSES:
                out.append(f"{where}: status {row.get('status')!r} is not one of {', '.join(STATUSES)}")
            if row.get("status") in ("reproduced", "partly", "runnable") and not (row.get("command") and row.get("files")):
                out.append(f"{where}: a {row['status']} row names its command and the files that show it (or will)")
            ran = [p for p in named_sweeps(row) if Path(p).name.startswith(("table", "fig")) and own_finished_runs(p)]
            if ran and (row.get("status") == "runnable" or "not run yet" in row.get("differs", "")):
                out.append(f"{where}: says it has not run, but {', '.join(ran)} has finished runs: say what ran")
            if row.get("status") in ("partly", "missing", "not-runnable") and not row.get("differs"):
                out.append(f"{where}: a {row['status']} row says what differs or is missing (`differs`)")
            for path in row.get("files", []) + re.findall(r"benchmarks/\S+\.(?:toml|sh|py)", row.get("command", "")):
                if not (ROOT / path.rstrip(";")).exists():
                    out.append(f"{where}: {path} does not exist")
        items = Counter(row.get("item") for row in rows)
        out += [f"{paper}: {item} listed {n} times" for item, n in items.items() if n > 1]
        folder = ROOT / PAPERS[paper][2]
        for sweep in sorted([*folder.glob("table*.toml"), *folder.glob("fig*.toml")]):
            rel = sweep.relative_to(ROOT).as_posix()
            if rel not in named:
                out.append(f"{rel}: a table or figure sweep no row of {SOURCE.name} names")
    return out


def named_sweeps(row: dict) -> list[str]:
    """The sweep files a row's command runs (``fedtail sweep FILE``)."""
    return re.findall(r"fedtail sweep (benchmarks/\S+?\.toml)", row.get("command", ""))


@functools.cache
def planned_runs(sweep: Path) -> frozenset[Path]:
    """The run folders a sweep file plans (as ``fedtail sweep`` does: each method's own seeds, the
    default setting); empty for other TOML files."""
    from fedtail.sweep.spec import load_sweep

    try:
        if "out" not in tomllib.loads(sweep.read_text()):
            return frozenset()
    except (OSError, tomllib.TOMLDecodeError):
        return frozenset()
    return frozenset((ROOT / run.dir).resolve() for run in load_sweep(sweep).runs)


def own_finished_runs(sweep: str) -> int:
    """How many runs only ``sweep`` plans (no other sweep file under benchmarks/ shares them) are finished."""
    path = ROOT / sweep
    others = set().union(*(planned_runs(p) for p in (ROOT / "benchmarks").glob("*/*.toml") if p != path))
    return sum((d / "summary.json").is_file() for d in planned_runs(path) - others)


def render(data: dict[str, list[dict]]) -> str:
    counts = Counter(row["status"] for rows in data.values() for row in rows)
    lines = [
        "# The four papers' tables and figures in fedtail",
        "",
        "Generated from `benchmarks/papers.toml` by `python benchmarks/papers.py` (checked by the test suite).",
        "One row per result table and figure of each paper, the diagrams and examples too. Status:",
        "**reproduced** (run here at the paper's design; on Fashion-MNIST where the paper used other data),",
        "**partly** (some of its rows, columns or seeds), **runnable** (fedtail has what it needs, not run yet),",
        "**missing** (a variant, a logged quantity or an analysis is not built yet), **not-runnable** (its data",
        "or task is not available here), **illustration** (no result to reproduce).",
        "",
        "In all: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES) + ".",
        "",
    ]
    for paper, rows in data.items():
        name, title, folder = PAPERS[paper]
        lines += [f"## {name}", "", f"{title}; runs and reports in `{folder}/`.", "",
                  "| item | what it measures | status | what differs | command | shown in |", "|---|---|---|---|---|---|"]
        for row in rows:
            files = ", ".join(f"[`{Path(f).name}`]({Path(f).relative_to('benchmarks').as_posix()})" for f in row.get("files", []))
            command = f"`{row['command']}`" if row.get("command") else ""
            lines.append(f"| {row['item']} | {row['measures']} | {row['status']} | {row.get('differs', '')} | {command} | {files} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    data = load()
    issues = problems(data)
    for issue in issues:
        print(f"papers.toml: {issue}", file=sys.stderr)
    text = render(data) + "\n"
    if "--check" in argv:
        stale = not TARGET.is_file() or TARGET.read_text() != text
        if stale:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python benchmarks/papers.py", file=sys.stderr)
        return 1 if issues or stale else 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 1 if issues else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
