"""fedtail from Python: run, load and sweep; and the contract a plug-in algorithm codes against.

    import fedtail
    result = fedtail.run(algorithm="fedavg", dataset="fmnist", rounds=5, clients=20, out=None)
    result.summary["final"]["personalized_acc"], len(result.rows), result.config.train.lr

:func:`run` takes the flags of ``fedtail run`` as keywords (dashes become underscores), plus
``set`` (``{"fedprox.mu": 0.1}`` or a list of ``"KEY=VALUE"``), ``config`` (a TOML file, as
``--config``), ``out`` (a folder, or None: nothing is written to disk), ``overwrite``,
``resume`` and ``callbacks`` (:class:`Callback` instances: the run's start, each evaluation, each
round and its end; for live logging, early looks at the state, a progress display). Bad input raises :class:`~fedtail.errors.ConfigError` / :class:`~fedtail.errors.DataError`
with the command line's messages; a diverged run raises :class:`~fedtail.errors.RunDiverged`
(its folder, if any, keeps the rows and a ``summary.json`` that says so).

The contract of an algorithm (see ``docs/extending.md``): an :class:`Algorithm` registers a
:class:`ServerHalf` (its ``run_round(rnd, clients, comm)`` talks to clients through a
:class:`Comm`), a :class:`ClientHalf` (one method per :class:`Message` kind, given a
:class:`ClientContext`), an optional :class:`EdgeHalf` and an :class:`AlgorithmConfig` of options.
Server halves get a :class:`ServerContext`; :class:`WeightedMean` is the streaming aggregate;
models are :class:`SplitModel` (body + head). Everything else in the package is internal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fedtail.algorithms.aggregate import WeightedMean
from fedtail.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ClientHalf,
    Comm,
    EdgeHalf,
    Message,
    PersonalClient,
    ServerHalf,
    StepHook,
    Tensors,
    Term,
    FeatureTerm,
)
from fedtail.config import FLAG_KEYS, RunConfig, flags_to_nested, load_toml, merge
from fedtail.data.base import Dataset, Split
from fedtail.engine.callbacks import Callback, Rows
from fedtail.engine.context import ClientContext, ServerContext
from fedtail.errors import ConfigError, DataError, FedtailError, RunDiverged
from fedtail.models.base import SplitModel

_EXTRA = ("set", "config", "out", "overwrite", "resume", "callbacks")


@dataclass
class RunResult:
    """One run: ``summary`` (what ``summary.json`` holds), ``rows`` (the metrics rows), ``config``."""

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    config: RunConfig
    dir: Path | None = None  # the run folder, when the run was written to disk
    partition: dict[str, Any] | None = field(default=None, repr=False)  # partition.json's content

    def frame(self):
        """The evaluations as a pandas DataFrame, one row each (:func:`fedtail.tables.evaluations`)."""
        from fedtail.tables import evaluations

        return evaluations(self)

    def row(self) -> dict[str, Any]:
        """The run as one flat row: config, summary metrics, code (:func:`fedtail.tables.run_row`)."""
        from fedtail.tables import run_row

        return run_row(self)


def _sets(value: Mapping[str, Any] | list[str] | tuple[str, ...] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()]
    return [str(v) for v in value]


def config_from_flags(**flags: Any) -> RunConfig:
    """The validated :class:`RunConfig` that ``fedtail run`` would build from these flags."""
    from fedtail.components import build_config

    unknown = sorted(set(flags) - set(FLAG_KEYS) - set(_EXTRA))
    if unknown:
        raise ConfigError(
            f"unknown keyword(s) {', '.join(unknown)}; allowed: {', '.join(sorted(FLAG_KEYS))}, {', '.join(_EXTRA)}"
        )
    given = {k: v for k, v in flags.items() if k in FLAG_KEYS and v is not None}
    if isinstance(given.get("quantity"), (list, tuple)):
        given["quantity"] = ":".join(str(int(q)) for q in given["quantity"])
    raw = flags_to_nested(load_toml(Path(flags["config"]))) if flags.get("config") else {}
    raw = merge(raw, flags_to_nested(given))
    return build_config(raw, _sets(flags.get("set")))


def _callbacks(value: Any) -> list[Callback]:
    """``callbacks=`` of :func:`run`: a list of :class:`Callback` instances, checked before the run."""
    if value is None:
        return []
    if isinstance(value, Callback) or not isinstance(value, (list, tuple)):
        raise ConfigError("callbacks: a list of fedtail.Callback instances (callbacks=[MyCallback()])")
    bad = [type(cb).__name__ for cb in value if not isinstance(cb, Callback)]
    if bad:
        raise ConfigError(f"callbacks: {', '.join(bad)} is not a fedtail.Callback (subclass it, override its on_* methods)")
    return list(value)


def run(**flags: Any) -> RunResult:
    """One run, as ``fedtail run`` does it (see the module docstring); ``out=None`` writes nothing.

    ``callbacks=[...]``: :class:`Callback` instances told of the run's start, every evaluation,
    every round and its end (:mod:`fedtail.engine.callbacks`)."""
    out = flags.get("out")
    config = config_from_flags(**flags)
    callbacks = _callbacks(flags.get("callbacks"))
    if out is None:
        from fedtail.engine import prepare
        from fedtail.engine.simulation import Simulation

        dataset, partition = prepare(config)
        from fedtail.tracking import trackers

        tracked = trackers(config, None)
        rows = Rows()
        sim = Simulation(config, dataset, partition, callbacks=[rows, *tracked, *callbacks])
        try:
            summary = sim.run()
        finally:
            for tracker in tracked:
                tracker.close()
        head = {"algorithm": config.algorithm, "dataset": config.dataset, "seed": config.seed}
        return RunResult(head | summary, rows.rows, config, None, partition.summary())
    from fedtail.report.runfiles import is_finished
    from fedtail.runner import run_to_folder

    out = Path(out)
    if is_finished(out) and not flags.get("overwrite"):
        raise FedtailError(f"out {out} already holds a finished (or diverged) run; pass overwrite=True")
    resume = True if flags.get("resume") else (False if flags.get("overwrite") else None)
    run_to_folder(config, out, callbacks, resume=resume)
    return load_run(out)


def load_runs(root: str | Path):
    """Every finished run folder under ``root`` as one row of a pandas DataFrame (:mod:`fedtail.tables`)."""
    from fedtail.tables import load_runs as load

    return load(root)


def load_run(run_dir: str | Path) -> RunResult:
    """A run folder (``config.json``, ``metrics.jsonl``, ``summary.json``) as a :class:`RunResult`."""
    run_dir = Path(run_dir)

    def read(name: str) -> Any:
        try:
            return json.loads((run_dir / name).read_text())
        except FileNotFoundError:
            raise FedtailError(f"{run_dir} holds no {name}: not a finished fedtail run folder") from None
        except ValueError as err:
            raise FedtailError(f"{run_dir / name} is not JSON ({err})") from None

    config = RunConfig.model_validate(read("config.json"))
    summary = read("summary.json")
    from fedtail.report.runfiles import read_record  # metrics.jsonl or metrics.jsonl.gz, ...

    rows = [json.loads(line) for line in (read_record(run_dir, "metrics.jsonl") or "").splitlines() if line.strip()]
    text = read_record(run_dir, "partition.json")
    partition = json.loads(text) if text is not None else None
    return RunResult(summary, rows, config, run_dir, partition)


def sweep(
    file: str | Path,
    *,
    jobs: int | None = None,
    methods: list[str] | None = None,
    settings: list[str] | None = None,
    out: str | Path | None = None,
    force: bool = False,
    rerun_diverged: bool = False,
    seeds: list[int] | None = None,
) -> dict[str, str]:
    """Run what a sweep file plans and is not done yet (as ``fedtail sweep``, without the console);
    returns ``{run folder: status}`` (done, diverged, failed, ...) of the selected runs."""
    from fedtail.sweep import Runner, SweepRecord, busy_dirs, check_stale, load_sweep, run_status, to_run
    from fedtail.sweep.estimate import learned

    plan = load_sweep(file, out=out, settings=settings, methods=methods, seeds=seeds)
    n_jobs = jobs or plan.jobs
    statuses = [run_status(r, busy_dirs()) for r in plan.runs]
    selected = plan.selected_dirs()
    check_stale([s for s in statuses if s.run.dir in selected], force)
    todo = to_run(statuses, plan, force, rerun_diverged)
    result = {str(s.run.dir): s.state for s in statuses if s.run.dir in selected}
    if not todo:
        return result
    record = SweepRecord(plan, statuses, f"fedtail.sweep({str(file)!r})", n_jobs)
    record.queue(todo)
    try:
        outcomes = Runner(n_jobs, force, None, learned(statuses), rerun_diverged).map(todo, record.update)
    except BaseException:
        record.interrupt(todo)
        raise
    for o in outcomes:
        state = "diverged" if o.diverged else "done" if o.ok else "skipped" if o.skipped else "failed"
        result[str(o.run.dir)] = state
    return result


__all__ = [
    "Algorithm",
    "AlgorithmConfig",
    "Callback",
    "ClientContext",
    "ClientHalf",
    "Comm",
    "ConfigError",
    "DataError",
    "Dataset",
    "EdgeHalf",
    "FedtailError",
    "Message",
    "PersonalClient",
    "RunDiverged",
    "RunResult",
    "ServerContext",
    "ServerHalf",
    "StepHook",
    "Term",
    "FeatureTerm",
    "Split",
    "SplitModel",
    "Tensors",
    "WeightedMean",
    "config_from_flags",
    "load_run",
    "load_runs",
    "run",
    "sweep",
]
