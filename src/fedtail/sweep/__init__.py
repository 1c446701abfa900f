"""``fedtail sweep``: a grid of runs (settings × methods × seeds) described by one TOML file.

File format::

    out = "runs/table2"        # folder of the runs, relative to the working directory
    seeds = [0, 1]             # one run per seed of every (setting, method)
    jobs = 2                   # runs in parallel (default 1; --jobs overrides)

    [base]                     # RunConfig keys, as `fedtail run --config FILE` accepts them
    dataset = "fmnist"
    [base.partition]
    scheme = "dirichlet"
    [base.train]
    lr = 0.005

    [settings."a0.5-if10"]     # deep-merged over [base]; optional (one setting "default")
    partition = { alpha = 0.5, imbalance = 10 }

    [methods.fedavg]           # algorithm defaults to the table's name
    [methods."mupfl-k2"]
    algorithm = "mupfl"        # optional
    options = { kappa = 2 }    # the algorithm's options (what --set mupfl.kappa=2 sets)
    train = { lr = 0.01 }      # any other RunConfig override, deep-merged last

A run's config is ``base ⊕ settings[s] ⊕ method overrides ⊕ {algorithm, options, seed}``,
validated by :func:`fedtail.components.build_config` (the code path of ``fedtail run``) for every
run before any run starts. ``seed`` comes from ``seeds`` only; ``algorithm`` only from the
methods. Runs go to ``{out}/{setting}/{method}/seed{seed}``.

Order (deterministic): settings in file order, then methods in file order, then seeds in
list order, so the columns of the report's tables (settings) fill one after the other. With
``jobs > 1`` runs start in that order as workers free up.

Resuming: a folder whose ``summary.json`` exists and whose ``config.json`` equals the planned
config (ignoring :data:`~fedtail.sweep.status.IGNORED_KEYS`, which do not change results) is
*done* and skipped; a folder without ``summary.json`` (killed or failed run) is *partial* when
it holds a checkpoint of the planned config (``checkpoint_every``; it resumes from there), else
*pending*: it is cleared and rerun; a finished folder with a different config is *stale*: an error unless
``force``; an unfinished folder named on the command line of a live process (a ``fedtail run``
writing it) is *busy* and left alone. Several sweeps may share ``out``: each run is claimed
(``.seed{k}.claim`` beside its folder, removed when it ends) and its folder checked again just
before it starts, so a run another sweep has started or finished meanwhile is *skipped*.

Each run executes in its own process (``python -m fedtail.sweep.runone DIR``, the config on
stdin, output in ``DIR/run.log``), so one crashing run does not stop the others.

Modules: :mod:`~fedtail.sweep.spec` (the file and the plan), :mod:`~fedtail.sweep.status`
(folders on disk, the run claims), :mod:`~fedtail.sweep.record` (``sweep.json``),
:mod:`~fedtail.sweep.pool` (runs in subprocesses), :mod:`~fedtail.sweep.runone` (one run).
The console output (the plan table, progress, one line per run) belongs to ``fedtail sweep``.
"""

import sys
import types

from fedtail.sweep.pool import RunOutcome, Runner, oversubscription
from fedtail.sweep.record import SweepRecord
from fedtail.sweep.spec import PlannedRun, Sweep, load_sweep
from fedtail.sweep.status import (
    PidLock,
    RunStatus,
    busy_dirs,
    check_stale,
    claim_path,
    config_diff,
    count,
    run_status,
    supersede,
    to_run,
)

__all__ = [
    "PidLock",
    "PlannedRun",
    "RunOutcome",
    "RunStatus",
    "Runner",
    "Sweep",
    "SweepRecord",
    "busy_dirs",
    "check_stale",
    "claim_path",
    "config_diff",
    "count",
    "load_sweep",
    "supersede",
    "oversubscription",
    "run_status",
    "to_run",
]


class _CallableModule(types.ModuleType):
    """``fedtail.sweep(FILE, ...)`` runs a sweep file (:func:`fedtail.api.sweep`), while
    ``fedtail.sweep.load_sweep`` and the rest stay this package's."""

    def __call__(self, file, **options):
        from fedtail.api import sweep

        return sweep(file, **options)


sys.modules[__name__].__class__ = _CallableModule
