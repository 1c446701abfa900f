"""One run into one folder: prepare the data, simulate, record ``config.json``, metrics, summary.

:func:`run_to_folder` is what ``fedtail run``, ``fedtail compare`` and every run of a sweep
execute; it prints nothing (the command line adds its progress bar through ``on_round``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from fedtail.config import RunConfig

OnRound = Callable[[int, "dict[str, Any] | None"], None]


def run_to_folder(config: RunConfig, out: Path, on_round: OnRound | None = None) -> dict[str, Any]:
    """Prepare, run and record one experiment into ``out``; returns the summary.

    Bad input (unknown data, a partition that cannot be cut) raises before anything is
    written. ``on_round(0, None)`` is called once when the rounds start, then
    ``on_round(rnd, row)`` after every round (``row`` is the evaluation of that round, or None).
    A crash leaves ``FAILED`` in ``out`` and is re-raised; ``summary.json`` is written last.
    """
    from fedtail.engine import prepare
    from fedtail.engine.simulation import Simulation
    from fedtail.report import RunWriter

    dataset, partition = prepare(config)  # raises before anything is written
    writer = RunWriter(out)
    sim = Simulation(config, dataset, partition, on_eval=writer.append_metrics, on_round=on_round)
    writer.start(config.model_dump(mode="json"), {"partition.json": partition.summary()})
    try:
        if on_round is not None:
            on_round(0, None)
        summary = sim.run()
    except BaseException as err:
        writer.fail(err)
        raise
    summary = {"algorithm": config.algorithm, "dataset": config.dataset, "seed": config.seed} | summary
    writer.finish(summary)
    return summary
