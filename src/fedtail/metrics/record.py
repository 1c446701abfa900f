"""The run record: cost meters and the history of evaluations, reduced to ``summary.json``.

Both the final and the best evaluation are reported, each with its round, so nobody has to
guess which one a number is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fedtail.metrics.accuracy import rounds_to_accuracy
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


@dataclass
class RunRecord:
    targets: list[float]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def summary(self, meter: Meter, wall_time_s: float, rounds: int) -> dict[str, Any]:
        if not self.rows:
            raise ValueError("no evaluation was recorded")
        final = self.rows[-1]
        best = max(self.rows, key=lambda r: (r["personalized_acc"], -r["round"]))
        history = [(r["round"], r["personalized_acc"]) for r in self.rows]
        global_history = [(r["round"], r["global_acc"]) for r in self.rows if r.get("global_acc") is not None]
        keys = (
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
        # Stage runs add their keys (A_local, A_global, A_part, the stage); other runs' summaries are unchanged.
        keys += tuple(k for k in STAGE_KEYS if k in final)
        return {
            "status": "finished",
            "final": {"round": final["round"]} | {k: final.get(k) for k in keys},
            "best": {"round": best["round"]} | {k: best.get(k) for k in keys},
            "best_global": (
                None
                if not global_history
                else dict(zip(("round", "global_acc"), max(global_history, key=lambda h: (h[1], -h[0]))))
            ),
            "rounds_to_accuracy": rounds_to_accuracy(history, self.targets),
            "rounds": rounds,
        } | costs(meter, wall_time_s)

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
