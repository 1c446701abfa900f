"""summary.json's reductions of the metrics rows: final, best (among the rows of the final seen
stages), last10 (means over the final 10 rounds of global optimisation) and named accuracies."""

from __future__ import annotations

import pytest

from conftest import tiny_config
from fedtail.metrics import Meter, RunRecord
from helpers import run_with_summary, staged


def row(rnd: int, acc: float, **extra) -> dict:
    return {"round": rnd, "personalized_acc": acc, "global_acc": None, "train_loss": 1.0 / rnd} | extra


def test_best_is_taken_among_the_rows_with_the_final_seen_stages():
    # an early stage (one stage seen) scores 0.9; the final stage's rows are all lower
    rows = [row(1, 0.9, seen_stages=1, stage=0, a_local=0.9), row(2, 0.5, seen_stages=2, stage=1, a_local=0.5),
            row(3, 0.7, seen_stages=2, stage=1, a_local=0.7), row(4, 0.6, seen_stages=2, stage=1, a_local=0.6)]  # fmt: skip
    summary = RunRecord([0.5], rows).summary(Meter(), 1.0, 4)
    assert summary["best"]["round"] == 3 and summary["best"]["personalized_acc"] == pytest.approx(0.7)
    assert summary["final"]["round"] == 4 and summary["final"]["seen_stages"] == 2
    # ties go to the earliest row; without stages every row is a candidate
    plain = RunRecord([0.5], [row(1, 0.9), row(2, 0.6), row(3, 0.9)]).summary(Meter(), 1.0, 3)
    assert plain["best"]["round"] == 1


def test_last10_is_the_mean_over_the_final_ten_rounds():
    rows = [row(r, r / 100) for r in range(1, 16)]
    last = RunRecord([0.5], rows).summary(Meter(), 1.0, 15)["last10"]
    assert last["rounds"] == [6, 15] and last["evaluations"] == 10
    assert last["personalized_acc"] == pytest.approx(sum(range(6, 16)) / 10 / 100)
    assert last["global_acc"] is None  # no value in the window: None, not 0
    # evaluated every 4th round: the rows of rounds 8, 12 and the last
    sparse = [row(r, r / 100) for r in (4, 8, 12, 15)]
    last = RunRecord([0.5], sparse).summary(Meter(), 1.0, 15)["last10"]
    assert last["rounds"] == [8, 15] and last["personalized_acc"] == pytest.approx((8 + 12 + 15) / 300)


def test_last10_counts_rounds_of_global_optimisation_with_nested_stages():
    # M = 3: rows at the end of rounds of global optimisation 1..12 (rounds 3, 6, ..., 36)
    rows = [row(3 * g, g / 100, global_round=g, seen_stages=3, stage=2) for g in range(1, 13)]
    last = RunRecord([0.5], rows).summary(Meter(), 1.0, 36)["last10"]
    assert last["rounds"] == [9, 36] and last["evaluations"] == 10
    assert last["personalized_acc"] == pytest.approx(sum(range(3, 13)) / 1000)
    assert "seen_stages" not in last and "stage" not in last


def test_named_accuracies_get_their_own_final_best_and_last10():
    rows = [row(r, 0.5, named={"gp": {"personalized_acc": a}, "lp": {"personalized_acc": 1 - a}})
            for r, a in ((1, 0.2), (2, 0.6), (3, 0.4))]  # fmt: skip
    named = RunRecord([0.5], rows).summary(Meter(), 1.0, 3)["named"]
    assert named["gp"]["final"]["personalized_acc"] == pytest.approx(0.4) and named["gp"]["final"]["round"] == 3
    assert named["gp"]["best"]["round"] == 2 and named["lp"]["best"]["round"] == 1
    assert named["lp"]["last10"]["personalized_acc"] == pytest.approx((0.8 + 0.4 + 0.6) / 3)


def test_every_run_summary_has_last10_and_stage_runs_their_named_a_local():
    summary, rows, _ = run_with_summary(tiny_config(rounds=3))
    assert summary["last10"]["evaluations"] == 3 and "named" not in summary
    assert summary["last10"]["personalized_acc"] == pytest.approx(sum(r["personalized_acc"] for r in rows) / 3)
    summary, rows, _ = run_with_summary(staged(algorithm="gldp", options={"head_epochs": 1}))
    assert set(summary["named"]) == {"gp", "lp", "head"}
    for name, entry in summary["named"].items():
        assert entry["final"]["a_local"] == rows[-1]["named"][name]["a_local"]
        assert entry["last10"]["a_part"] is not None
