"""Experiment tracking besides the run folder: ``--log tensorboard[:DIR]``.

``--log tensorboard`` writes each evaluation of the run as TensorBoard scalars, at the round as
the step, into ``OUT/tensorboard`` (``tensorboard:DIR``: into DIR; a run without a folder needs
DIR); ``tensorboard --logdir OUT`` (or a sweep's folder) shows them. What is written:

- ``accuracy/personalized`` (the mean over clients), ``accuracy/personalized_weighted``,
  ``accuracy/personalized_p10``, ``accuracy/personalized_std``, ``accuracy/global``,
  ``accuracy/head``, ``accuracy/middle``, ``accuracy/tail``, and ``accuracy/NAME`` for each named
  accuracy (GLDP's ``gp``, ``lp``, ``head``);
- ``train/loss`` (the round's), ``train/samples`` (trained so far), ``cost/elapsed_s``,
  ``cost/bytes_down`` and ``cost/bytes_up`` (so far);
- histograms ``clients/accuracy`` (each client's accuracy) and ``classes/accuracy`` (each
  class's), and the per-class accuracies as a Markdown table (text ``classes``);
- the resolved config as JSON text (``config``), at step 0.

The tracking is a :class:`~fedtail.engine.callbacks.Callback`: it reads the rows the run folder's
``metrics.jsonl`` gets, so the two agree. A resumed run continues the same log: the writer drops
what the stopped run wrote after its checkpoint's round (TensorBoard's ``purge_step``). Tracking
never changes a run's results, and a sweep ignores the setting. The library is an optional
dependency: ``pip install tensorboard`` (or ``fedtail[tensorboard]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtail.engine.callbacks import Callback
from fedtail.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from fedtail.config import RunConfig
    from fedtail.engine.simulation import Simulation

KINDS = ("tensorboard",)
SCALARS = {
    "personalized_acc": "accuracy/personalized",
    "personalized_acc_weighted": "accuracy/personalized_weighted",
    "personalized_acc_p10": "accuracy/personalized_p10",
    "personalized_acc_std": "accuracy/personalized_std",
    "global_acc": "accuracy/global",
    "head_acc": "accuracy/head",
    "middle_acc": "accuracy/middle",
    "tail_acc": "accuracy/tail",
    "train_loss": "train/loss",
    "samples_trained": "train/samples",
    "elapsed_s": "cost/elapsed_s",
    "bytes_down": "cost/bytes_down",
    "bytes_up": "cost/bytes_up",
}


def parse_log(spec: str) -> tuple[str, str | None]:
    """``KIND[:TARGET]`` of ``--log`` (a ValueError names the kinds there are)."""
    kind, _, target = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"--log {spec!r}: unknown kind {kind!r}; one of {', '.join(KINDS)} (as KIND or KIND:DIR)")
    return kind, target or None


def trackers(config: "RunConfig", out: Path | None) -> list[Callback]:
    """The callbacks of the run's ``--log`` settings; bad input (a missing library, no place to
    write) raises :class:`~fedtail.errors.ConfigError` before anything is written."""
    found: list[Callback] = []
    for spec in config.log:
        kind, target = parse_log(spec)
        if kind == "tensorboard":
            if target is None and out is None:
                raise ConfigError(f"--log {spec}: a run without an out folder needs --log tensorboard:DIR")
            found.append(TensorBoard(Path(target) if target else Path(out) / "tensorboard", config))
    return found


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--log tensorboard needs the tensorboard package: pip install tensorboard "
                          "(or pip install 'fedtail[tensorboard]')") from None  # fmt: skip
    return SummaryWriter


class TensorBoard(Callback):
    """Each evaluation's metrics as TensorBoard events in ``log_dir`` (module docstring)."""

    def __init__(self, log_dir: Path, config: "RunConfig") -> None:
        self.writer_class = _summary_writer()  # fails now, before the run, when the library is missing
        self.log_dir = Path(log_dir)
        self.config = config
        self.writer: Any = None

    def on_run_start(self, sim: "Simulation", first_round: int) -> None:
        # resumed: events after the checkpoint's round (written before the stop) are dropped
        self.writer = self.writer_class(str(self.log_dir), purge_step=first_round + 1 if first_round else None)
        if first_round == 0:
            text = json.dumps(self.config.model_dump(mode="json"), indent=2)
            self.writer.add_text("config", f"```\n{text}\n```", 0)

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        import numpy as np

        w, step = self.writer, int(row["round"])
        for key, tag in SCALARS.items():
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                w.add_scalar(tag, value, step)
        for name, metrics in (row.get("named") or {}).items():
            if isinstance(metrics.get("personalized_acc"), (int, float)):
                w.add_scalar(f"accuracy/{name}", metrics["personalized_acc"], step)
        per_client = [a for a in row.get("per_client_acc") or [] if a is not None]
        if per_client:
            w.add_histogram("clients/accuracy", np.asarray(per_client, dtype=np.float64), step)
        per_class = row.get("per_class_acc") or []
        shown = [a for a in per_class if a is not None]
        if shown:
            w.add_histogram("classes/accuracy", np.asarray(shown, dtype=np.float64), step)
            cells = " | ".join("—" if a is None else f"{100 * a:.2f}" for a in per_class)
            head = " | ".join(str(c) for c in range(len(per_class)))
            w.add_text("classes", f"| class | {head} |\n|---|{'---|' * len(per_class)}\n| accuracy % | {cells} |", step)
        w.flush()

    def on_run_end(self, sim: "Simulation", summary: dict[str, Any]) -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
