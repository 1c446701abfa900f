"""The run record: cost meters and the history of evaluations, reduced to ``summary.json``.

The final and the best evaluation are reported, each with its round, so nobody has to guess
which one a number is, and ``last10``, the means over the final 10 rounds (the GLDP paper's
Figure 4 plots "the test accuracy of our selected participating clients in the final 10 global
rounds"). With stage tasks the best is taken among the rows of the final set of seen stages.
Named accuracies (several prediction rules of one evaluation) get the same three entries each.
Segmentation runs add their mIoU / mAcc entries (:data:`~fedtail.metrics.segmentation.SEGMENTATION_KEYS`);
their accuracies are pixel accuracies, and their best round and rounds to the targets follow the
mIoU (``rounds_to_key`` names the value the rounds count).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fedtail.metrics.accuracy import rounds_to_accuracy
from fedtail.metrics.segmentation import SEGMENTATION_KEYS
from fedtail.metrics.stages import STAGE_KEYS


@dataclass
class Meter:
    """Cumulative costs of a run."""

    client_s: float = 0.0  # wall time spent waiting for client work (training and answering)
    client_task_s: float = 0.0  # sum of per-client compute time (exceeds client_s when parallel)
    server_s: float = 0.0  # wall time of server code between exchanges
    eval_s: float = 0.0  # wall time of evaluations
    samples_trained: int = 0
    bytes_down: int = 0  # server (or edge) -> clients
    bytes_up: int = 0  # clients -> server (or edge)
    bytes_edge_up: int = 0  # edges -> server
    exchanges: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The summary entries' keys (final, best, last10); stage runs add their STAGE_KEYS.
SUMMARY_KEYS = (
    "personalized_acc",
    "personalized_acc_weighted",
    "personalized_acc_std",
    "personalized_acc_p10",
    "head_acc",
    "middle_acc",
    "tail_acc",
    "global_acc",
    "train_loss",
)
# A named accuracy's entries (row["named"][NAME], see the engine's evaluation).
NAMED_KEYS = SUMMARY_KEYS[:7] + ("a_local", "a_part")
LAST_ROUNDS = 10  # the window of summary.json's "last10": the final 10 rounds (of global optimisation)
_NOT_MEANS = ("stage", "seen_stages")  # keys of a row that are not averaged in "last10"


def global_round(row: dict[str, Any]) -> int:
    """The round of global optimisation of a metrics row (its round, but with nested stages)."""
    return row.get("global_round", row["round"])


def entry(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {"round": row["round"]} | {k: row.get(k) for k in keys}


def window_mean(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Means of ``keys`` over ``rows`` (each over the rows where it is a number; None where none is)."""
    out: dict[str, Any] = {"rounds": [rows[0]["round"], rows[-1]["round"]], "evaluations": len(rows)}
    for k in keys:
        if k in _NOT_MEANS:
            continue
        values = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        out[k] = sum(values) / len(values) if values else None
    return out


def reductions(rows: list[dict[str, Any]], values: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """``final``, ``best`` and ``last10`` of the rows' ``values`` (a row's own, or one named accuracy's).

    ``best``: the highest ``personalized_acc`` (segmentation: ``personalized_miou``; earliest on ties) among the rows with the final
    row's set of seen stages (stage runs: an early stage is tested on fewer, often easier, stages,
    so its rows are no candidate for the run's best). ``last10``: the means over the rows of the
    final ``LAST_ROUNDS`` rounds of global optimisation (with ``rounds``, the first and last round
    of those rows, and ``evaluations``, how many there are).
    """
    final_row, final = rows[-1], values[-1]
    pairs = [(r, v) for r, v in zip(rows, values) if r.get("seen_stages") == final_row.get("seen_stages")]
    # the headline: a segmentation run's mIoU, else the accuracy
    key = "personalized_miou" if final.get("personalized_miou") is not None else "personalized_acc"
    best_row, best = max(pairs, key=lambda p: (p[1].get(key) if p[1].get(key) is not None else -1.0, -p[0]["round"]))
    last = global_round(final_row) - LAST_ROUNDS
    window = [v | {"round": r["round"]} for r, v in zip(rows, values) if global_round(r) > last]
    return {
        "final": entry(final | {"round": final_row["round"]}, keys),
        "best": entry(best | {"round": best_row["round"]}, keys),
        "last10": window_mean(window, keys),
    }


@dataclass
class RunRecord:
    targets: list[float]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def summary(self, meter: Meter, wall_time_s: float, rounds: int) -> dict[str, Any]:
        """``summary.json``: final, best and last10 (see :func:`reductions`), the best global
        accuracy, rounds to the targets, costs; ``named``: the same three for each named accuracy."""
        if not self.rows:
            raise ValueError("no evaluation was recorded")
        rows = self.rows
        final = rows[-1]
        # rounds to the targets on the headline (a segmentation run's mIoU: its pixel accuracy is
        # mostly background and reaches every target early)
        headline = "personalized_miou" if final.get("personalized_miou") is not None else "personalized_acc"
        history = [(r["round"], r[headline]) for r in rows if isinstance(r.get(headline), (int, float))]
        global_history = [(r["round"], r["global_acc"]) for r in rows if r.get("global_acc") is not None]
        # Stage runs add their keys (A_local, A_global, A_part, the stage); other runs' entries are unchanged.
        keys = SUMMARY_KEYS + tuple(k for k in STAGE_KEYS + SEGMENTATION_KEYS if k in final)
        out = {"status": "finished"} | reductions(rows, rows, keys)
        out |= {
            "best_global": (
                None
                if not global_history
                else dict(zip(("round", "global_acc"), max(global_history, key=lambda h: (h[1], -h[0]))))
            ),
            "rounds_to_accuracy": rounds_to_accuracy(history, self.targets),
            "rounds_to_key": headline,
            "rounds": rounds,
        }
        names = list(final.get("named") or {})
        if names:
            named_keys = NAMED_KEYS if "a_local" in final else NAMED_KEYS[:7]
            out["named"] = {}
            for name in names:
                kept = [r for r in rows if name in (r.get("named") or {})]
                out["named"][name] = reductions(kept, [r["named"][name] for r in kept], named_keys)
        return out | costs(meter, wall_time_s)

    def diverged(self, meter: Meter, wall_time_s: float, rounds: int, rnd: int, cause: str) -> dict[str, Any]:
        """The summary of a run stopped by divergence: where and why, the costs, no accuracy as a result."""
        return {
            "status": "diverged",
            "diverged": {"round": rnd, "cause": cause},
            "last_evaluated_round": self.rows[-1]["round"] if self.rows else None,
            "rounds": rounds,
        } | costs(meter, wall_time_s)


def costs(meter: Meter, wall_time_s: float) -> dict[str, Any]:
    return {
        "wall_time_s": wall_time_s,
        "samples_trained": meter.samples_trained,
        "samples_per_s": meter.samples_trained / meter.client_s if meter.client_s else None,
        "time_s": {"client": meter.client_s, "client_tasks": meter.client_task_s, "server": meter.server_s, "evaluation": meter.eval_s},
        "bytes": {"down": meter.bytes_down, "up": meter.bytes_up, "edge_up": meter.bytes_edge_up},
    }
