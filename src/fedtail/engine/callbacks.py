"""What a run tells the code around it: one small protocol, :class:`Callback`.

A :class:`~fedtail.engine.simulation.Simulation` takes a list of callbacks and calls, in list order:

- ``on_run_start(sim, first_round)``: once, before the rounds (``first_round`` is 0, or the round of
  the checkpoint the run resumes from);
- ``on_evaluation(sim, row)``: after every evaluation, with its metrics row (what ``metrics.jsonl``
  gets);
- ``on_round_end(sim, rnd, row)``: after every round, with the round's evaluation row or None;
- ``on_run_end(sim, summary)``: once, after the last round, with the summary (not after a
  divergence or an error).

The run folder's metrics file, its checkpoints and the command line's progress bar are callbacks
(:class:`MetricsFile`, :class:`Checkpointer`, the CLI's); a user's plugs in the same way, from
Python as ``fedtail.run(..., callbacks=[MyCallback()])``. A callback observes: what it changes in
the simulation is not part of the run's contract (its results must not depend on callbacks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from fedtail.engine.simulation import Simulation


class Callback:
    """Override the methods you need; every one does nothing by default."""

    def on_run_start(self, sim: "Simulation", first_round: int) -> None:
        """Before the first round to run (``first_round``: rounds already done, 0 or a checkpoint's)."""

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        """After an evaluation, with its metrics row."""

    def on_round_end(self, sim: "Simulation", rnd: int, row: dict[str, Any] | None) -> None:
        """After round ``rnd`` (and its evaluation, whose row is ``row``; None when not evaluated)."""

    def on_run_end(self, sim: "Simulation", summary: dict[str, Any]) -> None:
        """After the last round, with the run's summary."""


class Rows(Callback):
    """Keeps every evaluation row in ``rows`` (what ``metrics.jsonl`` would hold)."""

    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self.rows = [] if rows is None else rows

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        self.rows.append(row)


class OnRound(Callback):
    """``fn(first_round, None)`` when the rounds start, then ``fn(rnd, row)`` after every round."""

    def __init__(self, fn: Callable[[int, "dict[str, Any] | None"], None]) -> None:
        self.fn = fn

    def on_run_start(self, sim: "Simulation", first_round: int) -> None:
        self.fn(first_round, None)

    def on_round_end(self, sim: "Simulation", rnd: int, row: dict[str, Any] | None) -> None:
        self.fn(rnd, row)


class MetricsFile(Callback):
    """Appends each evaluation row to the run folder's ``metrics.jsonl`` (through its writer)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def on_evaluation(self, sim: "Simulation", row: dict[str, Any]) -> None:
        self.writer.append_metrics(row)


class Checkpointer(Callback):
    """Hands the run's :meth:`~fedtail.engine.simulation.Simulation.checkpoint_state` to ``save``
    after every ``checkpoint_every``-th round (not after the last: the finished run needs none).
    The runner's saves ``checkpoint.pt`` into the run folder (:func:`fedtail.engine.checkpoint.save`)."""

    def __init__(self, save: Callable[[dict[str, Any]], None]) -> None:
        self.save = save

    def on_round_end(self, sim: "Simulation", rnd: int, row: dict[str, Any] | None) -> None:
        every = sim.config.checkpoint_every
        if every and rnd % every == 0 and rnd < sim.config.rounds:
            self.save(sim.checkpoint_state(sim.elapsed()))
