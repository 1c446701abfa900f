"""One run into one folder: prepare the data, simulate, record ``config.json``, metrics, summary.

:func:`run_to_folder` is what ``fedtail run``, ``fedtail compare`` and every run of a sweep
execute; it prints nothing (the command line adds its progress bar as a callback).
Every ``checkpoint_every`` rounds the run's state goes to ``checkpoint.pt`` in the folder; a
run stopped after that resumes from it (``resume``) with the results of an unstopped run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from fedtail.config import RunConfig
from fedtail.engine.callbacks import Callback
from fedtail.errors import RunDiverged
from fedtail.machine import gpu_name, machine_info
from fedtail.provenance import code_info

def checkpoint_diffs(config: RunConfig, out: Path) -> tuple[dict[str, Any], list[str]] | None:
    """The checkpoint in ``out`` (its ``checkpoint.json``) and how its config differs from ``config``.

    None when ``out`` holds no checkpoint. Keys that do not change results (workers,
    checkpoint_every, log_clustering_every) are not differences.
    """
    from fedtail.report.runfiles import checkpoint_info, config_diff

    info = checkpoint_info(out)
    if info is None:
        return None
    return info, config_diff(info["config"], config.model_dump(mode="json"))


MASKS = "masks.npz"  # --sample-masks: the final evaluation's images, true and predicted masks


def write_masks(path: Path, masks: dict) -> None:
    """``masks.npz`` (compressed), written whole or not at all."""
    from fedtail.data.segmentation import save_npz

    save_npz(path, masks)


def run_to_folder(
    config: RunConfig,
    out: Path,
    callbacks: Sequence[Callback] = (),
    resume: bool | None = False,
    executor_factory: Callable[[Any], Any] | None = None,
    checkpoints: bool = True,
) -> dict[str, Any]:
    """Prepare, run and record one experiment into ``out``; returns the summary.

    Bad input (unknown data, a partition that cannot be cut) raises before anything is
    written. ``callbacks`` (:mod:`fedtail.engine.callbacks`) are told of the run after the
    folder's own (the metrics file, the checkpoints); their ``on_run_start`` comes once the
    folder is ready. A crash leaves ``FAILED`` in ``out`` and is re-raised; ``summary.json`` is
    written last, and the checkpoint is then deleted.

    ``resume``: True continues from ``out/checkpoint.pt``, which must exist and be of the same
    config (else :class:`~fedtail.engine.checkpoint.CheckpointError`); None does so when there is
    one of the same config and starts afresh otherwise; False starts afresh.

    ``executor_factory(simulation)`` replaces the simulator's executor (a Flower deployment's,
    :mod:`fedtail.flower`); an executor with ``summary(summary)`` adds its own costs to
    ``summary.json``. ``checkpoints=False`` writes none. An executor with ``checkpoint_state`` /
    ``restore_checkpoint`` (Flower's, whose nodes keep the client states) checkpoints and resumes its part too.
    """
    from fedtail.engine import checkpoint, prepare
    from fedtail.engine.callbacks import Checkpointer, MetricsFile
    from fedtail.engine.simulation import Simulation
    from fedtail.report import RunWriter
    from fedtail.report.runfiles import CHECKPOINT, config_diff
    from fedtail.tracking import trackers

    from fedtail.engine.device import resolve

    out = Path(out)
    device = resolve(config.device)  # a device torch does not see is bad input, before anything is written
    state = None
    if resume is None:
        found = checkpoint_diffs(config, out)
        resume = found is not None and not found[1]
    machine = machine_info(device)
    pieces = [_piece(1, machine)]
    if resume:
        state = checkpoint.load(out / CHECKPOINT)
        diffs = config_diff(state["config"], config.model_dump(mode="json"))
        if diffs:
            raise checkpoint.CheckpointError(
                f"{out / CHECKPOINT} is of a run with another config ({'; '.join(diffs)}); "
                "start afresh (fedtail run --overwrite) or choose another folder"
            )
        # checkpoints written before pieces were recorded: the earlier machines are unknown
        pieces = list(state.get("pieces") or [_piece(1, {})]) + [_piece(state["round"] + 1, machine)]
    tracked = trackers(config, out)  # --log: a missing library is bad input, before anything is written
    dataset, partition = prepare(config)  # raises before anything is written
    writer = RunWriter(out)
    own: list[Callback] = [MetricsFile(writer)]
    if checkpoints:
        own.append(Checkpointer(lambda state: checkpoint.save(out, state | {"pieces": pieces})))
    sim = Simulation(
        config,
        dataset,
        partition,
        callbacks=[*own, *tracked, *callbacks],
        executor_factory=executor_factory,
        run_dir=out,
    )
    try:
        if state is not None:
            sim.restore(state)
            writer.resume(config.model_dump(mode="json"), sim.record.rows)
        else:
            writer.start(config.model_dump(mode="json"), {"partition.json": partition.summary()})
    except BaseException:
        sim.executor.close()
        raise
    # The machine per run: a sweep's runs may span machines, and wall times compare only within one;
    # the code too: a sweep may outlive several commits of the library. A resumed run may have
    # run its pieces on different machines, and results are bit-identical only on one CPU
    # capability, so each piece names its own ("machine" is the last piece's).
    head = {
        "algorithm": config.algorithm,
        "dataset": config.dataset,
        "seed": config.seed,
        "machine": machine,
        "pieces": pieces,
        "code": code_info(),
    }
    try:
        summary = sim.run()
    except RunDiverged as err:
        writer.finish(_transport(sim, head | sim.diverged_summary(err)))  # the rows stay; no accuracy as a result
        raise
    except BaseException as err:
        writer.fail(err)
        raise
    finally:
        for tracker in tracked:
            tracker.close()
    summary = _transport(sim, head | summary)
    if sim.masks is not None:  # --sample-masks: beside summary.json, which marks the folder finished
        write_masks(out / MASKS, sim.masks)
    writer.finish(summary)
    return summary


def _piece(from_round: int, machine: dict[str, Any]) -> dict[str, Any]:
    """The part of a run from ``from_round`` on, as run by one process: its CPU and vector
    instructions, and the GPU when it ran on one."""
    piece = {"from_round": from_round, "cpu": machine.get("cpu"), "cpu_capability": machine.get("cpu_capability")}
    gpu = gpu_name(machine)
    return piece | {"gpu": gpu} if gpu else piece


def _transport(sim: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with what the executor measured itself (a Flower deployment's bytes on the wire)."""
    extra = getattr(sim.executor, "summary", None)
    return extra(summary) if extra else summary
