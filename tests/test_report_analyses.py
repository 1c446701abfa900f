"""``fedtail report``'s analyses: rounds to an accuracy level, sensitivity curves, clusters per round."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import tiny_config
from fedtail.report.analyses import cluster_counts, first_round_at, sensitivity_groups
from fedtail.report.collect import collect
from helpers import invoke
from test_report import make_run, table


def curve_run(folder: Path, accs: list[float], *, seed: int = 0, algorithm: str = "fedprox", options=None, rounds_log=None,
              eval_split: str = "test"):  # fmt: skip
    """A finished run whose evaluated rounds 1..n have the accuracies ``accs``, on ``eval_split``."""
    config = tiny_config(seed=seed, algorithm=algorithm, rounds=len(accs), options=options or {}).model_dump(mode="json")
    config["eval_split"] = eval_split
    make_run(folder, seed=seed, final=accs[-1], best=max(accs), best_round=1 + accs.index(max(accs)),
             rounds=len(accs), algorithm=algorithm, config=config, rounds_log=rounds_log)  # fmt: skip
    rows = [{"round": r, "personalized_acc": a, "rounds_log": (rounds_log or {}).get(r, [{"round": r}])}
            for r, a in enumerate(accs, 1)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_first_round_at_takes_the_first_evaluation_at_or_above_the_level():
    rows = [{"round": 4, "personalized_acc": 0.9}, {"round": 2, "personalized_acc": 0.8}, {"round": 3, "personalized_acc": 0.7}]
    assert first_round_at(rows, 0.8) == 2  # rows out of order are sorted; exactly the level counts
    assert first_round_at(rows, 0.85) == 4
    assert first_round_at(rows, 0.95) is None
    assert first_round_at([{"round": 1, "personalized_acc": float("nan")}], 0.1) is None


def test_rounds_to_table(tmp_path):
    root = tmp_path / "runs"
    curve_run(root / "s" / "fast" / "seed0", [0.5, 0.82, 0.91, 0.9], seed=0)
    curve_run(root / "s" / "fast" / "seed1", [0.81, 0.85, 0.88, 0.92], seed=1)
    curve_run(root / "s" / "slow" / "seed0", [0.5, 0.6, 0.7, 0.85], seed=0)
    curve_run(root / "s" / "slow" / "seed1", [0.5, 0.6, 0.7, 0.75], seed=1)
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md, "--rounds-to", 90, "--rounds-to", 80)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "--rounds-to 90 --rounds-to 80" in text  # the report command is recorded
    rows = table(text, "Rounds to reach 80 % / 90 % personalised accuracy")
    assert rows["fast"]["s: 80 %"] == "1.5 ± 0.7 (2 seeds)"  # rounds 2 and 1
    assert rows["fast"]["s: 90 %"] == "3.5 ± 0.7 (2 seeds)"  # rounds 3 and 4
    assert rows["slow"]["s: 80 %"] == "4 (1 of 2 seeds)"
    assert rows["slow"]["s: 90 %"] == "not reached (4 rounds)"


def test_rounds_to_rejects_levels_outside_percent(tmp_path):
    root = tmp_path / "runs"
    curve_run(root / "s" / "m" / "seed0", [0.5, 0.6])
    for bad in ("0", "150"):
        res = invoke("report", root, "--out", tmp_path / "R.md", "--rounds-to", bad)
        assert res.exit_code != 0
        assert "in (0, 100]" in res.output
    assert not (tmp_path / "R.md").exists()


def test_sensitivity_curves_are_found_from_the_configs(tmp_path):
    root = tmp_path / "runs"
    finals = {"mu0.001": 0.80, "mu0.01": 0.84, "mu0.1": 0.78}
    for name, acc in finals.items():
        curve_run(root / "s" / name / "seed0", [0.5, acc], options={"mu": float(name[2:])})
    # mu and the learning rate changed at once: not on the curve
    curve_run(root / "s" / "mu1-other" / "seed0", [0.5, 0.7], options={"mu": 1.0})
    cfg = json.loads((root / "s" / "mu1-other" / "seed0" / "config.json").read_text())
    cfg["train"]["lr"] = cfg["train"]["lr"] * 2  # and another learning rate: a different experiment
    (root / "s" / "mu1-other" / "seed0" / "config.json").write_text(json.dumps(cfg))
    # the default (fedprox's mu, not written in options) lines up with the written values
    curve_run(root / "s" / "default" / "seed0", [0.5, 0.83])
    groups = sensitivity_groups(collect([root]))
    assert len(groups) == 1
    g = groups[0]
    assert (g.algorithm, g.option) == ("fedprox", "mu")
    assert set(g.points) == {"mu0.001", "mu0.01", "mu0.1", "default"}
    assert g.points["mu0.1"] > g.points["mu0.001"] > 0
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    part = md.read_text().split("Sensitivity to one option", 1)[1].split("## Costs", 1)[0]
    # by value, the default (0.01 for fedprox) among them; the final round, then the last-10 mean
    # (from metrics.jsonl: the mean of rounds 1 and 2), the two metrics the verdicts rank by
    assert "| curve | value | method | s, final round | s, last-10 mean |" in part
    assert "| fedprox: mu | 0.001 | mu0.001 | 80.00 (1 seed) | 65.00 (1 seed) |" in part
    assert "| fedprox: mu | 0.01 | mu0.01 | 84.00 (1 seed) | 67.00 (1 seed) |" in part
    assert "| fedprox: mu | 0.1 | mu0.1 | 78.00 (1 seed) | 64.00 (1 seed) |" in part
    assert "mu1-other" not in part
    # by the last-10 means (from metrics.jsonl: rounds 1 and 2) and the final round alike, 0.01
    # (67.00 and 84.00, above the default's 66.50 and 83.00) is best, inside the grid
    assert "- fedprox: mu, s: best mu = 0.01 (last-10 mean 67.00 %; next 0.001, 2.00 points lower; final round 84.00 %; next 0.001, 4.00 points lower), inside the grid." in part
    assert (tmp_path / "R-sensitivity.png").stat().st_size > 5000


def test_the_sensitivity_table_has_one_column_per_setting_when_no_run_has_a_last10_mean(tmp_path):
    from fedtail.report.analyses import sensitivity_table

    root = tmp_path / "runs"
    for mu, acc in {0.01: 0.80, 0.1: 0.86, 1.0: 0.84}.items():
        curve_run(root / "s" / f"mu{mu:g}" / "seed0", [0.5, acc], options={"mu": mu})
        (root / "s" / f"mu{mu:g}" / "seed0" / "metrics.jsonl").unlink()  # nothing to derive it from
    col = collect([root])
    table = sensitivity_table(col, sensitivity_groups(col))
    assert "| curve | value | method | s |" in table
    assert "| fedprox: mu | 0.1 | mu0.1 | 86.00 (1 seed) |" in table
    assert "last-10" not in table


def _set_last10(folder: Path, value: float) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    summary["last10"] = {"rounds": [1, 2], "evaluations": 2, "personalized_acc": value}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_best_value_of_a_curve_and_whether_it_sits_at_the_grids_edge(tmp_path):
    from fedtail.report.analyses import grid_verdicts

    root = tmp_path / "runs"
    # finals favour mu 0.1, the last-10 means (the validation rule's metric) mu 1, the upper edge
    finals = {0.01: 0.80, 0.1: 0.86, 1.0: 0.84}
    last10 = {0.01: 0.79, 0.1: 0.82, 1.0: 0.83}
    for mu, acc in finals.items():
        for seed in (0, 1):
            folder = root / "s" / f"mu{mu:g}" / f"seed{seed}"
            curve_run(folder, [0.5, acc], seed=seed, options={"mu": mu}, eval_split="val")
            _set_last10(folder, last10[mu] + (0.01 if seed else -0.01))
    col = collect([root])
    lines = grid_verdicts(col, sensitivity_groups(col))
    assert lines == ["- fedprox: mu, s: by the last-10 mean, best mu = 1 (83.00 %; next 0.1, 1.00 points lower), at the grid's "
                     "upper edge: extend the grid above it, if the option allows; by the final round, best mu = 0.1 (86.00 %; "
                     "next 1, 2.00 points lower), inside the grid."]  # fmt: skip
    # one run without a last-10 entry nor the metrics to derive it: every point falls back to the
    # final round (mu 0.1, inside)
    summary = json.loads((root / "s" / "mu0.01" / "seed1" / "summary.json").read_text())
    del summary["last10"]
    (root / "s" / "mu0.01" / "seed1" / "summary.json").write_text(json.dumps(summary))
    (root / "s" / "mu0.01" / "seed1" / "metrics.jsonl").unlink()
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col)) == [
        "- fedprox: mu, s: by the final round, best mu = 0.1 (86.00 %; next 1, 2.00 points lower), inside the grid."
    ]
    # the lowest value best: the lower edge
    for seed in (0, 1):
        _set_last10(root / "s" / "mu0.01" / f"seed{seed}", 0.95)
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col)) == [
        "- fedprox: mu, s: by the last-10 mean, best mu = 0.01 (95.00 %; next 1, 12.00 points lower), at the grid's lower "
        "edge: extend the grid below it; by the final round, best mu = 0.1 (86.00 %; next 1, 2.00 points lower), inside the grid."
    ]
    # at the bound FedProx declares for mu (ge=0) the grid cannot extend
    for seed in (0, 1):
        folder = root / "s" / "mu0" / f"seed{seed}"
        curve_run(folder, [0.5, 0.9], seed=seed, options={"mu": 0.0}, eval_split="val")
        _set_last10(folder, 0.97)
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col)) == [
        "- fedprox: mu, s: best mu = 0 (last-10 mean 97.00 %; next 0.01, 2.00 points lower; final round 90.00 %; "
        "next 0.1, 4.00 points lower), at the option's lower bound (0): the grid cannot extend."
    ]
    # the same curve evaluated on test data: the edge is named without advice to extend the grid
    shutil.rmtree(root / "s" / "mu0")
    configs = sorted(root.glob("s/*/seed*/config.json"))
    assert len(configs) == 6
    for path in configs:
        path.write_text(json.dumps(json.loads(path.read_text()) | {"eval_split": "test"}))
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col))[0].startswith(
        "- fedprox: mu, s: by the last-10 mean, best mu = 0.01 (95.00 %; next 1, 12.00 points lower), at the grid's lower "
        "edge (test data: values are chosen on validation data, not here); "
    )


def diverged_run(folder: Path, *, seed: int = 0, options=None, round_: int = 2) -> None:
    """A run the engine stopped as diverged: its config, one evaluated round and a diverged summary."""
    curve_run(folder, [0.3, 0.3], seed=seed, options=options, eval_split="val")  # the same rounds as the curve's runs
    summary = {"algorithm": "fedprox", "seed": seed, "status": "diverged",
               "diverged": {"round": round_, "cause": "client 1: non-finite train_loss reported"}}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))


def test_a_diverged_value_closes_the_grid_on_its_side(tmp_path):
    from fedtail.report.analyses import grid_verdicts

    root = tmp_path / "runs"
    for mu, acc in {0.1: 0.80, 1.0: 0.84, 10.0: 0.86}.items():
        curve_run(root / "s" / f"mu{mu:g}" / "seed0", [0.5, acc], options={"mu": mu}, eval_split="val")
        _set_last10(root / "s" / f"mu{mu:g}" / "seed0", acc)
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col))[0].endswith("at the grid's upper edge: extend the grid above it, if the option allows.")
    diverged_run(root / "s" / "mu100" / "seed0", options={"mu": 100.0})
    col = collect([root])
    groups = sensitivity_groups(col)
    assert groups[0].points["mu100"] == 100.0  # the diverged value is on the curve
    assert grid_verdicts(col, groups) == [
        "- fedprox: mu, s: best mu = 10 (last-10 mean 86.00 %; next 1, 2.00 points lower; final round 86.00 %; next 1, "
        "2.00 points lower), at the highest value that ran to the end; 100 above it diverged. Diverged: mu = 100."
    ]
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    part = md.read_text().split("Sensitivity to one option", 1)[1]
    assert "| fedprox: mu | 100 | mu100 | diverged (round 2) | diverged (round 2) |" in part
    # a diverged value inside the grid is named, and the edge rule is unchanged
    diverged_run(root / "s" / "mu3" / "seed0", options={"mu": 3.0})
    (root / "s" / "mu100" / "seed0" / "summary.json").unlink()
    (root / "s" / "mu100" / "seed0" / "FAILED").write_text("killed\n")  # unfinished, not diverged: no point
    col = collect([root])
    assert grid_verdicts(col, sensitivity_groups(col))[0].endswith(
        "at the grid's upper edge: extend the grid above it, if the option allows. Diverged: mu = 3."
    )


def test_no_sensitivity_curve_from_two_points(tmp_path):
    root = tmp_path / "runs"
    for mu in (0.01, 0.1):
        curve_run(root / "s" / f"mu{mu}" / "seed0", [0.5, 0.8], options={"mu": mu}, eval_split="val")
    assert sensitivity_groups(collect([root])) == []
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    assert "Sensitivity to one option" not in md.read_text()
    assert not (tmp_path / "R-sensitivity.png").exists()


def test_cluster_counts_from_clustering_and_acmu_records(tmp_path):
    rows = [
        {"round": 2, "rounds_log": [{"round": 1, "clustering": {"num_clusters": 3}}, {"round": 2, "clustering": {"num_clusters": 4}}]},
        {"round": 3, "rounds_log": [{"round": 3, "acmu": [{"edge": 0, "kappa": 2}, {"edge": 1, "kappa": 5}]}]},
        {"round": 4, "rounds_log": [{"round": 4}, "junk", {"round": 5, "clustering": {"num_clusters": "x"}}]},
    ]
    assert cluster_counts(rows) == ([1, 2, 3], [3.0, 4.0, 3.5])
    assert cluster_counts([{"round": 1, "rounds_log": [{"round": 1}]}]) == ([], [])
    root = tmp_path / "runs"
    log = {r: [{"round": r, "clustering": {"num_clusters": k}}] for r, k in ((1, 2), (2, 3), (3, 3))}
    curve_run(root / "s" / "fedac" / "seed0", [0.5, 0.6, 0.7], algorithm="fedavg", rounds_log=log)
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    assert (tmp_path / "R-clusters-per-round.png").stat().st_size > 5000
    assert "Number of clusters per round" in md.read_text()


# --- reference numbers beside the stage-task tables (GLDP's Tables 1-3) ---------------------------


def stage_run(folder: Path, a_local: float, a_global: float | None, a_part: float) -> None:
    curve_run(folder, [0.5, a_local], algorithm="fedavg")
    summary = json.loads((folder / "summary.json").read_text())
    stage = {"round": 2, "personalized_acc": a_local, "a_local": a_local, "a_global": a_global, "a_part": a_part}
    summary["final"] = stage
    summary["last10"] = stage
    (folder / "summary.json").write_text(json.dumps(summary))


def test_stage_reference_columns_carry_their_label(tmp_path):
    root = tmp_path / "runs"
    stage_run(root / "20-4-5" / "fedavg" / "seed0", 0.40, 0.60, 0.45)
    stage_run(root / "20-4-5" / "gldp" / "seed0", 0.70, 0.65, 0.72)
    ref = tmp_path / "ref.toml"
    ref.write_text(
        'label = "paper, CIFAR-10"\nsource = "Table 2 and 3"\n'
        '[stages."20-4-5".fedavg]\na_local = 38.77\na_global = 59.94\n'
        '[stages."20-4-5".gldp]\na_local = 65.22\n'
        '[stages."100-4-1".fedavg]\na_local = 43.10\n'
    )
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md, "--reference", ref)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    rows = table(text, "Final-round stage-task accuracies (%)")
    assert rows["fedavg"]["20-4-5 A_local"] == "40.00 (1 seed)"
    assert rows["fedavg"]["20-4-5 A_local (paper, CIFAR-10)"] == "38.77"
    assert rows["gldp"]["20-4-5 A_local (paper, CIFAR-10)"] == "65.22"
    assert rows["fedavg"]["20-4-5 A_global (paper, CIFAR-10)"] == "59.94"
    assert rows["gldp"]["20-4-5 A_global (paper, CIFAR-10)"] == "—"
    assert "20-4-5 A_part (paper, CIFAR-10)" not in rows["fedavg"]  # no numbers: no column
    assert "Columns marked (paper, CIFAR-10)" in text
    assert "100-4-1 / fedavg" in text  # a reference number without runs is listed


def test_stage_reference_errors(tmp_path):
    root = tmp_path / "runs"
    stage_run(root / "s" / "fedavg" / "seed0", 0.4, 0.6, 0.45)
    for content, needle in (
        ('[stages.s.fedavg]\na_loc = 38.0\n', "unknown; use a_local"),
        ('[stages.s.fedavg]\na_local = 138.0\n', "percentage in [0, 100]"),
        ('label = ""\n[stages.s.fedavg]\na_local = 38.0\n', "label must be"),
    ):
        ref = tmp_path / "ref.toml"
        ref.write_text(content)
        res = invoke("report", root, "--out", tmp_path / "R.md", "--reference", ref)
        assert res.exit_code != 0 and needle in res.output, res.output


def test_a_compressed_metrics_record_is_read_like_the_plain_one(tmp_path):
    import gzip

    root = tmp_path / "runs"
    curve_run(root / "s" / "m" / "seed0", [0.5, 0.81, 0.92])
    plain = root / "s" / "m" / "seed0" / "metrics.jsonl"
    expected = collect([root]).runs[0].metrics()
    (plain.parent / "metrics.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    assert collect([root]).runs[0].metrics() == expected
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md, "--rounds-to", 90).exit_code == 0
    assert "| m | 3 (1 seed) |" in md.read_text()


def ccp_log(end: int | None, rounds: int) -> dict[int, list[dict]]:
    """FedReMa's rounds logs: MDS through round ``end`` (its record says ``ended``), G after it."""
    log = {}
    for r in range(1, rounds + 1):
        if end is None or r < end:
            rec = {"ccp": True, "ccp_rounds": r, "ratio": 0.9, "ended": False}
        elif r == end:
            rec = {"ccp": True, "ccp_rounds": r, "ratio": 0.1, "ended": True}
        else:
            rec = {"ccp": False, "ccp_rounds": end}
        log[r] = [{"round": r, "fedrema": rec}]
    return log


def test_ccp_table_gives_the_length_of_fedremas_critical_period(tmp_path):
    root = tmp_path / "runs"
    accs = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8]
    curve_run(root / "s" / "fedrema" / "seed0", accs, seed=0, algorithm="fedrema", rounds_log=ccp_log(2, 6))
    curve_run(root / "s" / "fedrema" / "seed1", accs, seed=1, algorithm="fedrema", rounds_log=ccp_log(4, 6))
    curve_run(root / "s" / "fedrema-d0.1" / "seed0", accs, seed=0, algorithm="fedrema", options={"delta": 0.1},
              rounds_log=ccp_log(None, 6))  # fmt: skip
    curve_run(root / "s" / "fedavg" / "seed0", accs, seed=0, algorithm="fedavg")
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    rows = table(md.read_text(), "Critical co-learning period (FedReMa)")
    assert rows["fedrema"]["s"] == "3.0 ± 1.4 (2 seeds)"  # CCPs of 2 and 4 rounds
    assert rows["fedrema-d0.1"]["s"] == "> 6 (did not end: 1 seed)"
    assert "fedavg" not in rows  # no FedReMa records, no row


def test_no_ccp_table_without_fedrema_runs(tmp_path):
    root = tmp_path / "runs"
    curve_run(root / "s" / "fedavg" / "seed0", [0.5, 0.6])
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    assert "Critical co-learning period" not in md.read_text()


def test_ccp_end_of_every_delta_is_read_from_the_mds_every_round_run(tmp_path):
    root = tmp_path / "runs"
    accs = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8]
    ratios = [1.0, 0.95, 0.6, 0.35, 0.2, 0.25]  # Eq. 9's ratio, round by round
    log = {r: [{"round": r, "fedrema": {"ccp": True, "ccp_rounds": r, "ratio": q, "ended": False}}]
           for r, q in enumerate(ratios, 1)}  # fmt: skip
    curve_run(root / "s" / "fedrema-no-ccp" / "seed0", accs, seed=0, algorithm="fedrema", options={"ccp": False},
              rounds_log=log)  # fmt: skip
    curve_run(root / "s" / "fedrema" / "seed0", accs, seed=0, algorithm="fedrema", rounds_log=ccp_log(3, 6))
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    # δ 0.1: never below in 6 rounds; 0.3: round 5 (0.2); 0.5: round 4 (0.35); 0.7: round 3; 0.9: round 3
    assert "| s | fedrema-no-ccp | 0 | > 6 | 5 | 4 | 3 | 3 |" in text
    assert "| s | fedrema | 0 |" not in text  # a run whose own CCP ended logs no ratios after it


def test_table3_rows_take_each_deltas_numbers_from_the_run_it_equals(tmp_path):
    root = tmp_path / "runs"
    ratios = [1.0, 0.95, 0.6, 0.35, 0.2, 0.25]  # δ 0.1: no end; 0.3: round 5; 0.5: round 4; 0.7 and 0.9: round 3
    log = {r: [{"round": r, "fedrema": {"ccp": True, "ccp_rounds": r, "ratio": q, "ended": False}}]
           for r, q in enumerate(ratios, 1)}  # fmt: skip
    curve_run(root / "s" / "fedrema-no-ccp" / "seed0", [0.5, 0.6, 0.7, 0.8, 0.8, 0.71], seed=0, algorithm="fedrema",
              options={"ccp": False}, rounds_log=log)  # fmt: skip
    curve_run(root / "s" / "fedrema" / "seed0", [0.5, 0.6, 0.7, 0.8, 0.9, 0.85], seed=0, algorithm="fedrema",
              rounds_log=ccp_log(4, 6))  # fmt: skip
    curve_run(root / "s" / "fedrema-delta0.9" / "seed0", [0.5, 0.6, 0.7, 0.75, 0.76, 0.73], seed=0,
              algorithm="fedrema", options={"delta": 0.9}, rounds_log=ccp_log(3, 6))  # fmt: skip
    curve_run(root / "s" / "fedrema-no-mds" / "seed0", [0.4] * 6, seed=0, algorithm="fedrema",
              options={"mds": False})  # fmt: skip
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    rows = {r[1]: r for r in (line.split(" | ") for line in md.read_text().splitlines()) if len(r) == 9 and r[0] == "| s"}
    assert rows["0.1"][2:5] == ["> 6", "80.00 (1 seed)", "71.00 (1 seed)"]
    assert rows["0.1"][8] == "seed 0: = fedrema-no-ccp (the CCP does not end within the run) |"
    # the paper's "Final Acc": the mean of the last 5 rounds (0.6 .. 0.71: 72.20; 0.6 .. 0.85: 77.00)
    assert rows["0.1"][5] == "72.20 (1 seed)" and rows["0.5"][5] == "77.00 (1 seed)"
    assert rows["0.3"][2:6] == ["5", "—", "—", "—"] and "no run ends its CCP in that round" in rows["0.3"][8]
    assert rows["0.5"][2:5] == ["4", "90.00 (1 seed)", "85.00 (1 seed)"] and "its own run |" in rows["0.5"][8]
    for delta in ("0.7", "0.9"):  # 0.7 was not run: the 0.9 run ended its CCP in the same round
        assert rows[delta][2:5] == ["3", "76.00 (1 seed)", "73.00 (1 seed)"]
    assert "= fedrema-delta0.9 (its CCP ended in the same round)" in rows["0.7"][8]
    assert rows["0.7"][7] == "10.5"  # the server seconds of the run used
    # a run made with a δ whose CCP ended elsewhere than the ratios say is flagged, not hidden
    curve_run(root / "s" / "fedrema-delta0.3" / "seed0", [0.5] * 6, seed=0, algorithm="fedrema",
              options={"delta": 0.3}, rounds_log=ccp_log(2, 6))  # fmt: skip
    assert invoke("report", root, "--out", md).exit_code == 0
    text = md.read_text()
    assert "whose CCP ended in round 2 where the ratios of fedrema-no-ccp say 5" in text
    assert "the runs are not the same up to the end" in text
    rows = {r[1]: r for r in (line.split(" | ") for line in text.splitlines()) if len(r) == 9 and r[0] == "| s"}
    assert rows["0.3"][2] == "2"  # the length the run beside it had, not the ratios'
    # runs on CPUs of different instruction sets round differently: the note says so
    for folder, capability in (("fedrema-no-ccp", "AVX512"), ("fedrema-delta0.3", "AVX2")):
        summary_path = root / "s" / folder / "seed0" / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary_path.write_text(json.dumps(summary | {"machine": {"cpu_capability": capability}}))
    assert invoke("report", root, "--out", md).exit_code == 0
    assert "CPUs of different capability (AVX512 and AVX2)" in md.read_text()
    # a run resumed on another machine: its pieces name the instruction sets in order
    summary_path = root / "s" / "fedrema-delta0.3" / "seed0" / "summary.json"
    summary = json.loads(summary_path.read_text())
    pieces = [{"from_round": 1, "cpu_capability": "AVX512"}, {"from_round": 5, "cpu_capability": "AVX2"}]
    summary_path.write_text(json.dumps(summary | {"pieces": pieces}))
    assert invoke("report", root, "--out", md).exit_code == 0
    assert "CPUs of different capability (AVX512 and AVX512, then AVX2)" in md.read_text()
    # a piece on an unknown machine: no cause is named
    pieces[0]["cpu_capability"] = None
    summary_path.write_text(json.dumps(summary | {"pieces": pieces}))
    assert invoke("report", root, "--out", md).exit_code == 0
    assert "CPUs of different capability" not in md.read_text()


def test_the_delta_curve_compares_every_delta_on_the_seeds_of_table3s_rows(tmp_path):
    root = tmp_path / "runs"
    ratios = {0: [1.0, 0.95, 0.6, 0.35, 0.2, 0.25], 1: [1.0, 0.5, 0.4, 0.25, 0.05, 0.3]}
    for seed, qs in ratios.items():
        log = {r: [{"round": r, "fedrema": {"ccp": True, "ccp_rounds": r, "ratio": q, "ended": False}}]
               for r, q in enumerate(qs, 1)}  # fmt: skip
        curve_run(root / "s" / "fedrema-no-ccp" / f"seed{seed}", [0.5] * 6, seed=seed, algorithm="fedrema",
                  options={"ccp": False}, rounds_log=log)  # fmt: skip
    # CCP ends, seed 0 / 1: δ 0.3 in rounds 5 / 4, δ 0.5 in 4 / 3, δ 0.7 in 3 / 2, δ 0.9 in 3 / 2
    made = {("fedrema", 0): (4, 0.70), ("fedrema", 1): (3, 0.72), ("fedrema-delta0.3", 0): (5, 0.60),
            ("fedrema-delta0.3", 1): (4, 0.62), ("fedrema-delta0.7", 0): (3, 0.80), ("fedrema-delta0.9", 1): (2, 0.90)}  # fmt: skip
    for (method, seed), (end, final) in made.items():
        delta = {"fedrema": {}, "fedrema-delta0.3": {"delta": 0.3}, "fedrema-delta0.7": {"delta": 0.7},
                 "fedrema-delta0.9": {"delta": 0.9}}[method]  # fmt: skip
        curve_run(root / "s" / method / f"seed{seed}", [0.5] * 5 + [final], seed=seed, algorithm="fedrema",
                  options=delta, rounds_log=ccp_log(end, 6))  # fmt: skip
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    # δ 0.7's seed 1 is δ 0.9's run and δ 0.9's seed 0 is δ 0.7's (their CCPs end in the same
    # rounds), so both points hold two seeds: (80 + 90) / 2, not one seed's 80 and 90
    assert "| fedrema: delta | 0.7 | fedrema-delta0.7 (seed 1: = fedrema-delta0.9) | 85.00 ± 7.07 (2 seeds) |" in text
    assert "| fedrema: delta | 0.9 | fedrema-delta0.9 (seed 0: = fedrema-delta0.7) | 85.00 ± 7.07 (2 seeds) |" in text
    assert "| fedrema: delta | 0.3 | fedrema-delta0.3 | 61.00 ± 1.41 (2 seeds) |" in text
    assert "takes that seed's numbers from the other method's run" in text
    # the verdict ranks the same cells: 0.7 and 0.9 tie at the top, 0.9 the grid's upper edge
    assert "best delta = 0.7 = 0.9" in text
    # test data: the edge is named, but no grid is to be widened after a look at test accuracy
    assert "at the grid's upper edge (test data: values are chosen on validation data, not here)." in text
    assert "extend the grid" not in text


def test_fedac_gc_over_rounds_and_against_k_from_fabricated_logs(tmp_path):
    """FedAC's Fig. 4(d) (G_c per round under CNT) and 4(c) (G_c against a preset K, CNT off)."""
    import json

    from conftest import tiny_config
    from fedtail.report.analyses import gc_band, gc_by_k, gc_series
    from fedtail.report.collect import collect
    from helpers import invoke

    def write(folder, options, gcs):
        folder.mkdir(parents=True)
        config = tiny_config(algorithm="fedac", rounds=len(gcs), options=options).model_dump(mode="json")
        (folder / "config.json").write_text(json.dumps(config))
        rows = [{"round": r, "personalized_acc": 0.5, "rounds_log": [{"round": r, "clustering": {"num_clusters": len(g), "gc": g}}]}
                for r, g in enumerate(gcs, 1)]  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        (folder / "summary.json").write_text(json.dumps({"algorithm": "fedac", "dataset": "synthetic", "seed": 0,
            "final": {"round": len(gcs), "personalized_acc": 0.5}, "best": {"round": 1, "personalized_acc": 0.5},
            "rounds": len(gcs), "wall_time_s": 1.0, "time_s": {}, "bytes": {"up": 1, "down": 1}}))  # fmt: skip

    root = tmp_path / "runs"
    write(root / "s" / "fedac" / "seed0", {}, [[0.1, 0.9], [0.3, 0.5, 0.7], [0.4, 0.6, 0.5]])
    for k, level in ((2, 0.8), (4, 0.5)):
        write(root / "s" / f"fedac-k{k}" / "seed0", {"num_clusters": k, "cnt": False}, [[level] * k] * 10)
    rows = [json.loads(x) for x in (root / "s" / "fedac" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert gc_series(rows)[1] == (2, [0.3, 0.5, 0.7])
    config = json.loads((root / "s" / "fedac" / "seed0" / "config.json").read_text())
    assert gc_band(config) == (0.2, 0.8) and gc_band(config | {"algorithm": "ifca"}) is None
    assert gc_by_k(collect([root])) == {"s": [(2, 0.8, 0.0), (4, 0.5, 0.0)]}
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "R-gc-s-fedac.png").stat().st_size > 5000 and (tmp_path / "R-gc-by-k.png").is_file()
    assert not list(tmp_path.glob("R-gc-s-fedac-k*"))  # CNT off: no per-round band figure
