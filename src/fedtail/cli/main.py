"""The ``fedtail`` command line: run, compare, sweep, report, list, partition, flower.

Every bad input ends in one line ``error: ...`` naming the flag or key and what is allowed,
with exit code 2, before any run folder is created. A run that diverges ends in one line
``error: run diverged at round R: <what, which client>`` with exit code 3; its folder keeps the
rows and a ``summary.json`` with ``"status": "diverged"``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedtail.cli.options import with_setting_options
from fedtail.config import FLAG_KEYS, flags_to_nested
from fedtail.errors import FedtailError, RunDiverged

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Personalized federated learning on long-tailed data.")
console = Console(stderr=True)


EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3


def _version(value: bool) -> None:
    if value:
        from fedtail import __version__

        print(f"fedtail {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version and exit"),
) -> None:
    """Personalized federated learning on long-tailed data."""


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    from rich.markup import escape

    # escaped: messages quote TOML tables such as [settings.x], which are not Rich markup
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def raw_from_flags(flags: dict[str, Any], config_file: Optional[Path]) -> dict[str, Any]:
    from fedtail.config import load_toml, merge

    raw: dict[str, Any] = flags_to_nested(load_toml(config_file)) if config_file else {}
    return merge(raw, flags_to_nested({k: v for k, v in flags.items() if v is not None}))


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[acc]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal and not _force_progress(),
    )


def _force_progress() -> bool:
    import os

    return os.environ.get("FEDTAIL_PROGRESS") == "1"


def execute_run(config, out: Path, resume: bool | None = False) -> dict[str, Any]:
    """:func:`fedtail.runner.run_to_folder` with a progress bar of the rounds on stderr."""
    from fedtail.engine.callbacks import OnRound
    from fedtail.runner import run_to_folder

    progress = _progress()
    task = None

    def on_round(rnd: int, row: dict[str, Any] | None) -> None:
        nonlocal task
        if task is None:  # the data is prepared and config.json written (round 0, or the checkpoint's)
            progress.start()
            task = progress.add_task("run", total=config.rounds, acc="")
        fields = {}
        if row is not None:
            g = row.get("global_acc")
            fields["acc"] = f"pers {row['personalized_acc']:.4f}" + (f" glob {g:.4f}" if g is not None else "")
            if "stage" in row:
                fields["acc"] += f" stage {row['stage']}"
        progress.update(task, completed=rnd, **fields)

    try:
        return run_to_folder(config, out, [OnRound(on_round)], resume=resume)
    finally:
        progress.stop()


@app.command()
@with_setting_options("run")
def run(
    *,
    set_: list[str] = typer.Option([], "--set", help="KEY=VALUE, e.g. fedprox.mu=0.01 or partition.min_samples=20"),
    config_file: Optional[Path] = typer.Option(None, "--config", help="TOML file with the same keys"),
    out: Path = typer.Option(..., "--out", help="run folder to write"),
    overwrite: bool = typer.Option(False, help="replace a finished run, or a checkpointed one, in --out"),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="continue the stopped run in --out from its checkpoint, with --out's config.json as the config "
        "(flags that change results are refused); a checkpoint of the same config is resumed even without it",
    ),
    **settings: Any,
) -> None:
    """Run one experiment and write config.json, metrics.jsonl and summary.json to --out."""
    try:
        config, found = resolve_run({"set_": set_, "config_file": config_file, "out": out, "overwrite": overwrite,
                                     "resume": resume, **settings})  # fmt: skip
        if found is not None:
            console.print(f"resuming {out} from its checkpoint after round {found[0]['round']}", highlight=False)
        summary = execute_run(config, out, resume=found is not None)
    except FedtailError as err:
        fail(str(err))
    except RunDiverged as err:
        fail(f"{err} (rows and summary.json in {out})", EXIT_DIVERGED)
    except KeyboardInterrupt:
        _interrupted(out)
    print_summary(summary, out)


def resolve_run(kwargs: dict[str, Any]) -> tuple[Any, tuple[dict[str, Any], list[str]] | None]:
    """The config of ``fedtail run``'s arguments (``kwargs``: its parameters) and the checkpoint in
    --out it resumes (None: it starts afresh); ``fedtail flower local / run`` resolve theirs the same way.

    --resume takes --out's config.json as the base (flags that change results are refused); a
    checkpoint of the same config is resumed without it too; one of another config is refused; so
    is a finished run unless --overwrite.
    """
    from fedtail.config import merge
    from fedtail.components import algorithm, build_config
    from fedtail.engine import guard
    from fedtail.report import is_finished
    from fedtail.runner import checkpoint_diffs

    out, resume, overwrite = kwargs["out"], kwargs["resume"], kwargs["overwrite"]
    if resume and overwrite:
        raise FedtailError("--resume continues the run in --out and --overwrite replaces it: choose one")
    raw = raw_from_flags({k: v for k, v in kwargs.items() if k in FLAG_KEYS}, kwargs["config_file"])
    if resume:
        raw = merge(_folder_config(out), raw)
    # A resumed run's config.json is read as stored: no reference settings are filled in.
    config = build_config(raw, kwargs["set_"], reference=not resume)
    guard.check(config, algorithm(config.algorithm))  # --aggregate / --dp-clip the method cannot take: before anything starts
    if is_finished(out) and not overwrite:
        raise FedtailError(
            f"--out {out} already holds a finished (or diverged) run; pass --overwrite or choose another folder"
        )
    found = None if overwrite else checkpoint_diffs(config, out)
    if found is not None and found[1]:
        info, diffs = found
        raise FedtailError(
            f"--out {out} holds a checkpoint (round {info['round']} of {info.get('rounds', '?')}) of a run "
            f"with another config: {'; '.join(diffs)}; pass --overwrite to start afresh or choose another folder"
        )
    if resume and found is None:
        raise FedtailError(f"--resume: {out} holds no checkpoint ({out / 'checkpoint.pt'}); run without --resume")
    return config, found


def _folder_config(out: Path) -> dict[str, Any]:
    """``out/config.json`` (the base config of ``--resume``)."""
    try:
        return json.loads((out / "config.json").read_text())
    except FileNotFoundError:
        raise FedtailError(f"--resume: {out} holds no run (no config.json) and so no checkpoint") from None
    except ValueError as err:
        raise FedtailError(f"--resume: {out / 'config.json'} is not JSON ({err})") from None


def _interrupted(out: Path) -> None:
    from fedtail.report.runfiles import checkpoint_info

    info = checkpoint_info(out)
    where = (
        f"`fedtail run --resume --out {out}` continues from the checkpoint after round {info['round']}"
        if info
        else "no checkpoint was written yet"
    )
    console.print(f"[bold red]interrupted[/]: {where}", highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def print_summary(summary: dict[str, Any], out: Path) -> None:
    table = Table(title=f"{summary['algorithm']} on {summary['dataset']} (seed {summary['seed']})")
    seg = "personalized_miou" in summary["final"]  # a segmentation run: mIoU / mAcc, accuracies of pixels
    cols = ("", "round", "pers. mIoU", "pers. mAcc", "pixel acc", "global mIoU") if seg else (
        "", "round", "personalized", "weighted", "global")
    for col in cols:
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    for name in ("final", "best", "last10"):
        s = summary.get(name)
        if s is None:  # a summary from before last10 existed
            continue
        rounds = f"{s['rounds'][0]}-{s['rounds'][1]}" if name == "last10" else str(s["round"])
        keys = ("personalized_miou", "personalized_macc", "personalized_acc", "global_miou") if seg else (
            "personalized_acc", "personalized_acc_weighted", "global_acc")
        table.add_row(name, rounds, *(fmt(s.get(k)) for k in keys))
    Console().print(table)
    final = summary["final"]
    if "a_local" in final:  # stage tasks: the paper's metrics on the seen stages' test data
        Console().print(
            f"stage {final['stage']} (final): A_local {fmt(final['a_local'])}, A_global {fmt(final['a_global'])}, "
            f"A_part {fmt(final['a_part'])}"
        )
    for name, entry in (summary.get("named") or {}).items():  # several accuracies of one evaluation
        f, last = entry["final"], entry["last10"]
        stage = f", A_local {fmt(f['a_local'])}, A_part {fmt(f['a_part'])}" if "a_local" in f else ""
        Console().print(
            f"{name}: final {fmt(f['personalized_acc'])}{stage}; best {fmt(entry['best']['personalized_acc'])} "
            f"(round {entry['best']['round']}); last10 {fmt(last['personalized_acc'])}"
        )
    Console().print(f"wall time {summary['wall_time_s']:.1f} s, {summary['samples_trained']} samples trained -> {out}")


@app.command()
def compare(
    algorithms: str = typer.Option(..., help="comma-separated algorithm names"),
    config_file: Optional[Path] = typer.Option(None, "--config", help="TOML file with the shared settings"),
    set_: list[str] = typer.Option([], "--set", help="KEY=VALUE overrides"),
    seed: Optional[int] = typer.Option(None),
    workers: Optional[int] = typer.Option(None),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda | cuda:N (as fedtail run)"),
    out: Path = typer.Option(..., "--out", help="folder; each algorithm's run goes to OUT/ALGORITHM"),
) -> None:
    """Run several algorithms on the same data and partition, then print one table."""
    from fedtail.components import build_config

    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    summaries = []
    try:
        raw = raw_from_flags({"seed": seed, "workers": workers, "device": device}, config_file)
        configs = [build_config(raw | {"algorithm": name}, set_) for name in names]
        for config in configs:
            console.print(f"[bold]{config.algorithm}[/]")
            # a checkpoint of the same run (a stopped compare) is resumed
            try:
                summaries.append(execute_run(config, out / config.algorithm, resume=None))
            except RunDiverged as err:  # the other algorithms still run; the table says which diverged
                console.print(f"[bold red]{config.algorithm}:[/] {err}", highlight=False, soft_wrap=True)
                summaries.append({"algorithm": config.algorithm, "status": "diverged", "diverged": err.round})
    except FedtailError as err:
        fail(str(err))
    table = Table(title=f"{configs[0].dataset}, {configs[0].partition.scheme}, IF={configs[0].partition.imbalance:g}")
    for col in ("algorithm", "final pers.", "weighted", "best pers. (round)", "global", "tail", "wall s"):
        table.add_column(col)
    for s in summaries:
        if s.get("status") == "diverged":
            table.add_row(s["algorithm"], f"diverged (round {s['diverged']})", *[""] * 5)
            continue
        f, b = s["final"], s["best"]
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        table.add_row(
            s["algorithm"],
            fmt(f["personalized_acc"]),
            fmt(f["personalized_acc_weighted"]),
            f"{fmt(b['personalized_acc'])} ({b['round']})",
            fmt(f["global_acc"]),
            fmt(f["tail_acc"]),
            f"{s['wall_time_s']:.0f}",
        )
    Console().print(table)
    if any(s.get("status") == "diverged" for s in summaries):
        raise typer.Exit(EXIT_DIVERGED)


def _names_option(text: Optional[str]) -> Optional[list[str]]:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _seeds_option(text: Optional[str]) -> Optional[list[int]]:
    names = _names_option(text)
    if names is None:
        return None
    if not all(n.isdigit() for n in names):
        raise typer.BadParameter(f"--seeds {text}: give seeds as comma-separated integers >= 0, e.g. 0,1")
    return [int(n) for n in names]


@app.command()
def sweep(
    file: Path = typer.Argument(..., help="sweep TOML file (out, seeds, jobs, \\[base], \\[settings.*], \\[methods.*])"),
    jobs: Optional[int] = typer.Option(None, help="runs in parallel (overrides the file's `jobs`)"),
    methods: Optional[str] = typer.Option(None, help="comma-separated subset of the file's methods"),
    settings: Optional[str] = typer.Option(None, help="comma-separated subset of the file's settings"),
    seeds: Optional[str] = typer.Option(None, help="comma-separated subset of the file's seeds, e.g. 0,1"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the runs with their status; run nothing"),
    force: bool = typer.Option(False, "--force", help="rerun finished runs whose config differs (stale)"),
    supersede: Optional[str] = typer.Option(
        None,
        "--supersede",
        metavar="TAG",
        help="move stale runs to {out}/../superseded/TAG/{out name}/ (kept whole), then run them anew",
    ),
    rerun_diverged: bool = typer.Option(False, "--rerun-diverged", help="rerun runs that diverged (kept otherwise)"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder of the runs (overrides the file's `out`)"),
    time_limit: Optional[str] = typer.Option(
        None,
        "--time-limit",
        help="e.g. 2h or 1h30m: start only runs expected (from finished ones) to end within it; the rest wait",
    ),
    times_from: Optional[list[Path]] = typer.Option(
        None,
        "--times-from",
        metavar="FOLDER",
        help="finished runs of other sweeps (repeatable): time guesses, per round and algorithm, for runs "
        "with none of their own",
    ),
    compress: bool = typer.Option(
        False, "--compress", help="store each finished run's metrics.jsonl and partition.json gzipped (.gz), "
        "as the committed benchmark runs are; every reader reads both",
    ),
) -> None:
    """Run settings × methods × seeds from a TOML file, in parallel, skipping finished runs.

    File format and resume rules: docs/sweeps.md (and the fedtail.sweep package).
    """
    from fedtail.cli.sweep_cmd import sweep_command

    try:
        code = sweep_command(
            file,
            jobs=jobs,
            methods=_names_option(methods),
            settings=_names_option(settings),
            seeds=_seeds_option(seeds),
            dry_run=dry_run,
            force=force,
            out=out,
            console=console,
            stdout=Console(),
            time_limit=time_limit,
            rerun_diverged=rerun_diverged,
            supersede_tag=supersede,
            times_from=times_from,
            compress=compress,
        )
    except FedtailError as err:
        fail(str(err))
    except KeyboardInterrupt:
        console.print(
            "[bold red]interrupted[/]: the next `fedtail sweep` resumes unfinished runs from their checkpoints "
            "(or reruns them)"
        )
        raise typer.Exit(130)
    if code:
        raise typer.Exit(code)


@app.command()
def report(
    run_dirs: Optional[list[Path]] = typer.Argument(
        None, help="run folders, or folders containing them (searched recursively); or use --sweep"
    ),
    sweep_files: list[Path] = typer.Option(
        [], "--sweep", help="sweep TOML file: one section with its planned runs (repeat for more sections)"
    ),
    out: Path = typer.Option(..., "--out", help="Markdown file to write; PNG figures are written beside it"),
    reference: Optional[Path] = typer.Option(None, help="TOML with \\[reference.SETTING] METHOD = percent"),
    title: Optional[str] = typer.Option(None, help="report title"),
    command: Optional[str] = typer.Option(None, help="the command that produced the runs (default: from sweep.json)"),
    rounds_to: list[float] = typer.Option(
        [], "--rounds-to", help="accuracy level in percent (repeatable): a table of the rounds to reach it"
    ),
    clients_to: list[str] = typer.Option(
        [], "--clients-to", help="LEVEL:K[,K...] (repeatable), e.g. 70:15,20,25: a table of the wall seconds until "
        "K clients' own accuracy reaches LEVEL percent"
    ),
) -> None:
    """Tables (mean ± std over seeds) and figures of finished runs, as Markdown + PNG.

    RUN_DIRS: one table of every run found. --sweep FILE (repeatable): one section per file.
    """
    import shlex

    from rich.markup import escape

    from fedtail.report.document import write_report
    from fedtail.report.sweepdoc import write_sweep_report

    run_dirs = run_dirs or []
    argv = ["fedtail", "report", *map(str, run_dirs)]
    for file in sweep_files:
        argv += ["--sweep", str(file)]
    argv += ["--out", str(out)]
    for flag, value in (("--reference", reference), ("--title", title), ("--command", command)):
        if value is not None:
            argv += [flag, str(value)]
    for level in rounds_to:
        argv += ["--rounds-to", f"{level:g}"]
    for spec in clients_to:
        argv += ["--clients-to", spec]
    try:
        from fedtail.report.analyses import parse_clients_to

        specs = parse_clients_to(clients_to)
        if run_dirs and sweep_files:
            raise FedtailError("report: give run folders or --sweep files, not both")
        if not run_dirs and not sweep_files:
            raise FedtailError("report: give run folders (RUN_DIRS...) or one or more --sweep FILE.toml")
        write = write_sweep_report if sweep_files else write_report
        result = write(
            sweep_files or run_dirs,
            out,
            report_command=shlex.join(argv),
            reference_path=reference,
            title=title,
            command=command,
            rounds_to=rounds_to,
            clients_to=specs,
        )
    except FedtailError as err:
        fail(str(err))
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    figures = "".join(f", {p}" for p in result.plots)
    console.print(escape(f"wrote {out}{figures}"), highlight=False, soft_wrap=True)


@app.command("runs")
def runs_cmd(
    root: Path = typer.Argument(..., help="folder holding run folders (searched recursively)"),
    csv: Optional[Path] = typer.Option(None, "--csv", help="write the table as CSV to this file"),
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="write the table as Parquet (needs pyarrow)"),
    compress: bool = typer.Option(
        False, "--compress", help="also store every finished run's metrics.jsonl and partition.json gzipped "
        "(.gz) in place of the plain files (unfinished runs are left alone)",
    ),
) -> None:
    """Every finished run under ROOT as one row (config, final / best / last-10 metrics, status,
    seconds, code commit): printed briefly, written whole with --csv / --parquet (fedtail.load_runs)."""
    from fedtail.tables import load_runs

    if compress:
        from fedtail.report.runfiles import compress_records

        packed = [p for summary in sorted(root.rglob("summary.json")) for p in compress_records(summary.parent)]
        console.print(f"compressed {len(packed)} record(s) under {root}", highlight=False)
    try:
        frame = load_runs(root)
        if parquet is not None:
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise FedtailError("--parquet needs pyarrow: pip install pyarrow (or write --csv)") from None
            parquet.parent.mkdir(parents=True, exist_ok=True)
            frame.to_parquet(parquet, index=False)
        if csv is not None:
            csv.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(csv, index=False)
    except FedtailError as err:
        fail(str(err))
    table = Table(title=f"{len(frame)} run(s) under {root}")
    where = ["setting", "method"] if "method" in frame and frame["method"].notna().all() else ["path"]
    shown = [c for c in (*where, "config.algorithm", "config.seed", "status", "final.personalized_acc",
                         "last10.personalized_acc", "wall_time_s") if c in frame]  # fmt: skip
    for column in shown:
        table.add_column(column.replace("config.", "").replace(".personalized_acc", " acc"))
    for _, row in frame.iterrows():
        cells = []
        for column in shown:
            value = row[column]
            cells.append(f"{100 * value:.2f}" if column.endswith("_acc") and value == value and value is not None
                         else f"{value:.0f}" if column == "wall_time_s" and value == value else str(value))  # fmt: skip
        table.add_row(*cells)
    console.print(table)
    for path in (csv, parquet):
        if path is not None:
            typer.echo(f"wrote {path} ({len(frame)} rows, {len(frame.columns)} columns)")


@app.command("list")
def list_components() -> None:
    """Algorithms, datasets, models (built-in and installed plug-ins) and partitions, one line each.

    Under each built-in algorithm, its reference settings (head split, momentum, gradient
    clipping, options), which a run gets unless it sets them, its tasks, and whether it takes the
    robust --aggregate rules and client-level DP (--dp-clip); under each model, its head splits.
    """
    from fedtail.algorithms import ALGORITHMS
    from fedtail.components import listing
    from fedtail.models import MODELS, describe_heads
    from fedtail.partition import SCHEMES

    entries = listing() | {"partition": SCHEMES}
    def tasks(name: str) -> str:
        spec = ALGORITHMS[name]
        why = "; ".join(f"not {task}: {reason}" for task, reason in spec.why_not.items())
        return ", ".join(spec.tasks) + (f" ({why})" if why else "")

    def takes(declared: bool | str) -> str:
        return "yes" if declared is True else ("no: " + declared if isinstance(declared, str) else "not declared")

    details = {
        "algorithm": lambda n: [
            ("reference:", ALGORITHMS[n].reference.describe()), ("tasks:", tasks(n)),
            ("robust:", "--aggregate median|trimmed|krum: " + takes(ALGORITHMS[n].robust)),
            ("privacy:", "client-level DP (--dp-clip): " + takes(ALGORITHMS[n].dp)),
        ] if n in ALGORITHMS else [],
        "model": lambda n: [("head splits:", describe_heads(n))] if n in MODELS else [],
    }
    indent = " " * 28
    for kind in ("algorithm", "dataset", "model", "partition"):
        for name in sorted(entries[kind]):
            typer.echo(f"{kind:<10} {name:<16} {entries[kind][name]}")
            for label, text in details[kind](name) if kind in details else []:
                typer.echo(f"{indent}{label} {text}")


@app.command("partition")
@with_setting_options("partition")
def partition_cmd(
    *,
    set_: list[str] = typer.Option([], "--set", help="KEY=VALUE overrides"),
    config_file: Optional[Path] = typer.Option(None, "--config"),
    out: Path = typer.Option(..., "--out", help="JSON file to write; a PNG heatmap is written beside it"),
    **settings: Any,
) -> None:
    """Cut a dataset into clients and write the per-client class counts (JSON + PNG heatmap)."""
    from fedtail.components import build_config
    from fedtail.engine import prepare
    from fedtail.partition import plot_heatmap

    flags = {k: v for k, v in settings.items() if k in FLAG_KEYS}
    try:
        config = build_config(raw_from_flags(flags, config_file), set_, rounds=False)
        _, part = prepare(config, run=False)
    except FedtailError as err:
        fail(str(err))
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = part.summary()
    out.write_text(json.dumps(summary, indent=1) + "\n")
    png = out.with_suffix(".png")
    plot_heatmap(part, png)
    sizes = [sum(c["train_counts"]) for c in summary["clients"]]
    typer.echo(
        f"{len(sizes)} clients, {sum(sizes)} training samples (min {min(sizes)}, max {max(sizes)}) -> {out}, {png}"
    )
    if part.clients and part.clients[0].classes is not None:  # --partition semantic
        kept = [[int(x) for x in c.classes] for c in part.clients]
        shown = "; ".join(f"{k}: {','.join(map(str, cls))}" for k, cls in enumerate(kept[:12]))
        typer.echo(f"classes each client keeps (the rest its background): {shown}"
                   + (f"; ... ({len(kept) - 12} more in {out.name})" if len(kept) > 12 else ""))  # fmt: skip
        if part.pixel_counts is not None:
            pixels = [int(v) for v in part.pixel_counts]
            typer.echo(f"training pixels per class (the long tail, background left out): {', '.join(map(str, pixels))}")
    if part.clients and part.clients[0].stages:
        per_stage = [len(st.classes) for c in part.clients for st in c.stages]
        held = [len({int(x) for st in c.stages for x in st.classes}) for c in part.clients]
        again = sum(bool(set(st.classes.tolist()) & {int(x) for e in c.stages[:k] for x in e.classes})
                    for c in part.clients for k, st in enumerate(c.stages))
        typer.echo(
            f"{len(part.clients[0].stages)} stage tasks per client of {min(per_stage)}-{max(per_stage)} classes; "
            f"a client holds {min(held)}-{max(held)} classes; {again} stage tasks bring back a class of an earlier one"
        )


# `fedtail flower ...` (imported last: it copies the options of `run` above; Flower itself loads lazily)
from fedtail.cli.flower_cmd import flower_app  # noqa: E402

app.add_typer(flower_app, name="flower")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
