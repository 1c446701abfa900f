"""Metrics of stage-task runs (GLDP's STHFL setting, ``--partition stages``, any M, M = 1 too).

After round r every client is evaluated on the local test data of the stage tasks trained so far
(its "seen" stages: 0..m with blocks; all M after the first round of global optimisation with
nested stages). The GLDP paper (STHFL, Sec. 5.1, "Evaluation Metrics") defines

    "1) A_global measure is the global model to perform verification tests on all client data
    samples. 2) A_local measure is the local personalization model to perform validation tests
    on all client data samples. 3) A_part measure is the local personalization model to test the
    partial client participants. ... where D and D' represent the set of samples from all previous
    stages."

From per-client per-class counts of that evaluation (and per stage, so a class that recurs in
two stages of a client counts in each):

- ``a_local``: each client's local model on its own seen-stage test data, unweighted mean over
  ALL clients. The local model is the personalised model, which is what ``personalized_acc``
  evaluates, except for methods whose personalised model is the global model (their client half
  evaluates the model it is sent: FedAvg, FedProx, FEDIC, CReFF, ...): for them the engine
  evaluates each client's own latest locally trained model (its last upload), the global model for
  a client that has not trained yet. The paper's numbers call for that: its FedAvg has A_local
  38.77 (Table 3, CIFAR-10 [20, 4, 5], IF 50) and A_global 59.94 (Table 2), so its A_local is not
  the global model; and "the FEDIC and CReFF method has no personalized model, thus use global
  model and no results" (those two have no A_local rows).
- ``a_part``: the same mean over the clients of the latest round only (with nested stages, the
  clients of the latest round of global optimisation).
- ``a_global``: the global model on every client's seen-stage test data, pooled (correct over
  total; a test sample drawn by two clients counts twice); None without a global model.
- ``a_local_by_stage[k]`` / ``a_global_by_stage[k]``: the same on stage k's test data alone
  (k < seen stages): how much of an earlier stage is kept (forgetting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# The keys stage runs add to each metrics row (and to summary.json's final/best entries).
STAGE_KEYS = ("stage", "seen_stages", "a_local", "a_global", "a_part")


@dataclass
class StageCounts:
    """Counts of one model per client: (clients, classes) and per seen stage (clients, stages, classes)."""

    correct: np.ndarray
    total: np.ndarray
    by_stage_correct: np.ndarray
    by_stage_total: np.ndarray


def _client_accuracy(correct: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Per-client accuracy over a (clients, classes) count matrix; NaN for a client without data."""
    n = total.sum(axis=1)
    out = np.full(len(n), np.nan)
    np.divide(correct.sum(axis=1), n, out=out, where=n > 0)
    return out


def _mean(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def _pooled(correct: np.ndarray, total: np.ndarray) -> float | None:
    n = total.sum()
    return float(correct.sum() / n) if n else None


def local_metrics(local: StageCounts, participants: Sequence[int]) -> dict[str, Any]:
    """``a_local``, ``a_part`` and ``a_local_by_stage`` of one model per client."""
    acc = _client_accuracy(local.correct, local.total)
    part = np.asarray(sorted(participants), dtype=np.int64)
    stages = local.by_stage_total.shape[1]
    return {
        "a_local": _mean(acc),
        "a_part": _mean(acc[part]),
        "a_local_by_stage": [
            _mean(_client_accuracy(local.by_stage_correct[:, k], local.by_stage_total[:, k])) for k in range(stages)
        ],
    }


def stage_metrics(
    local: StageCounts, participants: Sequence[int], global_counts: StageCounts | None = None
) -> dict[str, Any]:
    """A_local, A_part, A_global and their per-stage breakdowns.

    ``local``: the clients' local models on their seen-stage data; ``participants``: the clients
    of the latest round; ``global_counts``: the global model on each client's seen-stage data, or None.
    """
    loc = local_metrics(local, participants)
    out: dict[str, Any] = {"a_local": loc["a_local"], "a_global": None, "a_part": loc["a_part"],
                           "a_local_by_stage": loc["a_local_by_stage"], "a_global_by_stage": None}  # fmt: skip
    if global_counts is not None:
        g = global_counts
        out["a_global"] = _pooled(g.correct, g.total)
        out["a_global_by_stage"] = [
            _pooled(g.by_stage_correct[:, k], g.by_stage_total[:, k]) for k in range(g.by_stage_total.shape[1])
        ]
    return out
