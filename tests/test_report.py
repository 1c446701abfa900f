"""`fedtail report`: table numbers from fabricated summaries, references, missing runs, figures."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from conftest import tiny_config
from fedtail.report.collect import collect, setting_label
from fedtail.report.analyses import plot_cluster_counts
from fedtail.report.plots import acmu_records, pick_rounds, plot_acmu
from fedtail.report.sweepdoc import sweep_title
from fedtail.sweep import load_sweep
from helpers import invoke, sweep_base


def make_run(folder: Path, *, seed: int, final: float, best: float, best_round: int, rounds: int = 4,
             algorithm: str = "fedavg", rounds_log=None, bytes_up: int = 2_000_000, wall: float = 120.0,
             alpha: float = 0.5, finished: bool = True, config: dict | None = None) -> None:  # fmt: skip
    """A run folder as `fedtail run` writes it, with chosen accuracies (``config``: its config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    if config is None:
        made = tiny_config(seed=seed, algorithm=algorithm, rounds=rounds, partition={"alpha": alpha})
        config = made.model_dump(mode="json")
    (folder / "config.json").write_text(json.dumps(config))
    rows = []
    for rnd in range(1, rounds + 1):
        acc = best if rnd == best_round else final if rnd == rounds else min(final, best) - 0.01 * (rounds - rnd)
        row = {"round": rnd, "personalized_acc": acc, "rounds_log": (rounds_log or {}).get(rnd, [{"round": rnd}])}
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not finished:
        (folder / "FAILED").write_text("RuntimeError: killed in a test\n")
        return
    summary = {
        "algorithm": algorithm,
        "dataset": "synthetic",
        "seed": seed,
        "final": {"round": rounds, "personalized_acc": final},
        "best": {"round": best_round, "personalized_acc": best},
        "rounds": rounds,
        "wall_time_s": wall,
        "time_s": {"client": wall - 10.5, "server": 10.5},
        "bytes": {"up": bytes_up, "down": 2 * bytes_up, "edge_up": 0},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


# setting -> method -> seed -> (final, best, best_round)
GRID = {
    "s-b": {
        "fedavg": {0: (0.801, 0.823, 2), 1: (0.774, 0.790, 3), 2: (0.7912, 0.80, 3)},
        "local": {0: (0.60, 0.61, 1), 1: (0.58, 0.64, 2)},  # seed 2 missing
    },
    "s-a": {
        "fedavg": {0: (0.70, 0.72, 3), 1: (0.69, 0.71, 2), 2: (0.66, 0.70, 1)},
        # "local" absent entirely in s-a
    },
}


@pytest.fixture
def sweep_dir(tmp_path):
    root = tmp_path / "runs"
    for setting, methods in GRID.items():
        for method, seeds in methods.items():
            for seed, (final, best, rnd) in seeds.items():
                make_run(root / setting / method / f"seed{seed}", seed=seed, final=final, best=best, best_round=rnd,
                         algorithm=method)  # fmt: skip
    # an unfinished run (killed): not in the tables, listed as incomplete
    make_run(root / "s-b" / "local" / "seed2", seed=2, final=0.5, best=0.5, best_round=1, algorithm="local", finished=False)
    plan = {
        "file": "grid.toml",
        "command": "fedtail sweep grid.toml --jobs 2",
        # sweep order differs from alphabetical: rows and columns must follow it
        "settings": ["s-b", "s-a"],
        "methods": ["local", "fedavg"],
        "seeds": [0, 1, 2],
        "runs": [
            {"setting": s, "method": m, "seed": k, "dir": f"{s}/{m}/seed{k}"}
            for s in ("s-b", "s-a") for m in ("local", "fedavg") for k in (0, 1, 2)
        ],  # fmt: skip
    }
    (root / "sweep.json").write_text(json.dumps(plan))
    return root


def table(text: str, heading: str) -> dict[str, dict[str, str]]:
    """The Markdown table under ``heading`` as {row name: {column: cell}}."""
    section = re.split(r"\n##+ ", text.split(f"## {heading}", 1)[1])[0]  # up to the next heading
    lines = [l for l in section.splitlines() if l.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = dict(zip(cols[1:], cells[1:]))
    assert len(lines) >= 3
    return out


def expected_cell(values: list[float]) -> str:
    mean = f"{100 * statistics.fmean(values):.2f}"
    if len(values) == 1:
        return f"{mean} (1 seed)"
    return f"{mean} ± {100 * statistics.stdev(values):.2f} ({len(values)} seeds)"


def test_tables_are_mean_and_std_of_the_summaries(sweep_dir, tmp_path):
    md = tmp_path / "out" / "REPORT.md"
    res = invoke("report", sweep_dir, "--out", md, "--title", "Grid test")
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert text.startswith("# Grid test")
    final = table(text, "Final-round personalised accuracy (%)")
    best = table(text, "Best-round personalised accuracy (%)")
    assert list(final) == ["local", "fedavg"]  # rows in sweep order
    assert list(final["fedavg"]) == ["s-b", "s-a"]  # columns in sweep order
    for setting, methods in GRID.items():
        for method, seeds in methods.items():
            finals = [v[0] for v in seeds.values()]
            bests = [v[1] for v in seeds.values()]
            rounds = [v[2] for v in seeds.values()]
            assert final[method][setting] == expected_cell(finals)
            span = f"r{min(rounds)}" if min(rounds) == max(rounds) else f"r{min(rounds)}–{max(rounds)}"
            assert best[method][setting] == f"{expected_cell(bests)} @ {span}"
    # spot check by hand, so the helper itself cannot hide an error
    assert final["fedavg"]["s-b"] == "78.87 ± 1.37 (3 seeds)"


def test_last10_of_a_summary_that_predates_it_comes_from_metrics(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root / "s" / "fedavg" / f"seed{seed}", seed=seed, final=0.6, best=0.6, best_round=12, rounds=12)
        # rounds 1..12 at 0.50, 0.51, ..., 0.61: the final 10 (rounds 3..12) average 0.565
        rows = [{"round": r, "personalized_acc": 0.49 + r / 100} for r in range(1, 13)]
        (root / "s" / "fedavg" / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary_path = root / "s" / "fedavg" / "seed1" / "summary.json"
    summary = json.loads(summary_path.read_text()) | {"last10": {"personalized_acc": 0.61}}
    summary_path.write_text(json.dumps(summary))  # a summary's own last10 is kept

    runs = {r.seed: r for r in collect([root]).runs}
    derived = runs[0].summary["last10"]
    assert derived["personalized_acc"] == pytest.approx(0.565)
    assert derived["rounds"] == [3, 12] and derived["evaluations"] == 10
    assert derived["derived"] == "metrics.jsonl"
    assert runs[1].summary["last10"] == {"personalized_acc": 0.61}
    assert "last10" not in json.loads((root / "s" / "fedavg" / "seed0" / "summary.json").read_text())  # files untouched

    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    last10 = table(md.read_text(), "Personalised accuracy, mean over the final 10 rounds (%)")
    assert last10["fedavg"]["s"] == expected_cell([0.565, 0.61])


def test_missing_runs_show_a_dash_and_are_listed(sweep_dir, tmp_path):
    md = tmp_path / "R.md"
    res = invoke("report", sweep_dir, "--out", md)
    assert res.exit_code == 0, res.output
    assert "unfinished run" in res.output and "warning" in res.output
    text = md.read_text()
    assert table(text, "Final-round personalised accuracy (%)")["local"]["s-a"] == "—"
    assert table(text, "Best-round personalised accuracy (%)")["local"]["s-a"] == "—"
    incomplete = text.split("## Incomplete cells", 1)[1].split("\n## ")[0]
    assert "`s-b` / `local`: 2 of 3 seeds finished" in incomplete and "killed in a test" in incomplete
    assert "`s-a` / `local`: 0 of 3 seeds finished" in incomplete and "no run folder" in incomplete
    assert "`s-b` / `fedavg`" not in incomplete


def test_reference_numbers_appear_beside_ours(sweep_dir, tmp_path):
    ref = tmp_path / "ref.toml"
    ref.write_text(
        'source = "MuPFL Table II"\n[reference.s-a]\nfedavg = 71.5\nlocal = 55\n'
        "[reference.s-z]\nfedavg = 1.0\n"
    )
    md = tmp_path / "R.md"
    res = invoke("report", sweep_dir, "--out", md, "--reference", ref)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    for heading in ("Final-round personalised accuracy (%)", "Best-round personalised accuracy (%)"):
        t = table(text, heading)
        assert t["fedavg"]["s-a (paper)"] == "71.50" and t["local"]["s-a (paper)"] == "55.00"
        assert "s-b (paper)" not in t["fedavg"]  # no reference for s-b: no column
    assert "MuPFL Table II" in text and "s-z / fedavg" in text  # unmatched reference entries are listed


@pytest.mark.parametrize(
    "content, needle",
    [("[reference.x]\nfedavg = 180\n", "percentage"), ("[ref]\n", "unknown key"), ("x = [", "not valid TOML")],
)
def test_bad_reference_file(sweep_dir, tmp_path, content, needle):
    ref = tmp_path / "ref.toml"
    ref.write_text(content)
    res = invoke("report", sweep_dir, "--out", tmp_path / "R.md", "--reference", ref)
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "R.md").exists()


def test_costs_table(sweep_dir, tmp_path):
    md = tmp_path / "R.md"
    assert invoke("report", sweep_dir, "--out", md).exit_code == 0
    costs = md.read_text().split("## Costs", 1)[1].split("\n## ")[0]
    # 2e6 bytes up over 4 rounds = 0.5 MB per round; down is twice that; 120 s = 2 minutes (30 s a round),
    # 10.5 s on the server
    assert "| fedavg | s-b | 3 | 2.00 | 30.00 | 10.5 | 0.500 | 1.000 | 0.000 | — |" in costs  # no machine recorded
    # 8 finished runs of 2 minutes each (the killed run has no wall time): 16 min
    assert "In total 8 timed runs, 0.3 h of wall time" in costs


def test_costs_table_names_the_instruction_sets_of_the_runs(sweep_dir, tmp_path):
    def ran_on(folder, *caps):
        path = sweep_dir / folder / "summary.json"
        pieces = [{"from_round": 1 + i, "cpu_capability": c} for i, c in enumerate(caps)]
        path.write_text(json.dumps(json.loads(path.read_text()) | {"pieces": pieces}))

    ran_on("s-b/fedavg/seed0", "AVX2")
    ran_on("s-b/fedavg/seed1", "AVX2")
    ran_on("s-b/fedavg/seed2", "AVX2", "AVX512")  # resumed on another machine
    ran_on("s-a/fedavg/seed0", "AVX512")  # s-a's other two seeds: not recorded
    md = tmp_path / "R.md"
    assert invoke("report", sweep_dir, "--out", md).exit_code == 0
    costs = md.read_text().split("## Costs", 1)[1].split("\n## ")[0]
    assert "| fedavg | s-b | 3 | 2.00 | 30.00 | 10.5 | 0.500 | 1.000 | 0.000 | AVX2 ×2, AVX2, then AVX512 |" in costs
    assert "| fedavg | s-a | 3 | 2.00 | 30.00 | 10.5 | 0.500 | 1.000 | 0.000 | ? ×2, AVX512 |" in costs
    assert "| local | s-b | 2 | 2.00 | 30.00 | 10.5 | 0.500 | 1.000 | 0.000 | — |" in costs


def test_header_names_commands_and_machine(sweep_dir, tmp_path):
    md = tmp_path / "R.md"
    assert invoke("report", sweep_dir, "--out", md, "--title", "T").exit_code == 0
    text = md.read_text()
    assert "`fedtail sweep grid.toml --jobs 2`" in text
    assert f"`fedtail report {sweep_dir} --out {md} --title T`" in text
    assert "cores" in text and "torch" in text and re.search(r"Date: \d{4}-\d\d-\d\d", text)
    assert invoke("report", sweep_dir, "--out", md, "--command", "make table2").exit_code == 0
    assert "Runs produced by: `make table2`" in md.read_text()


def test_tables_are_reproducible(sweep_dir, tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    assert invoke("report", sweep_dir, "--out", a).exit_code == 0
    assert invoke("report", sweep_dir, "--out", b).exit_code == 0
    body = lambda p: p.read_text().split("## Final", 1)[1].split("## Figures")[0]  # noqa: E731
    assert body(a) == body(b)


def test_accuracy_plot_is_written_and_referenced(sweep_dir, tmp_path):
    md = tmp_path / "R.md"
    assert invoke("report", sweep_dir, "--out", md).exit_code == 0
    png = tmp_path / "R-accuracy.png"
    assert png.stat().st_size > 5000
    assert "](R-accuracy.png)" in md.read_text()


def test_the_evaluated_split_is_named(tmp_path):
    test_run = tiny_config(seed=0).model_dump(mode="json")
    val_run = tiny_config(seed=1, eval_split="val", partition={"alpha": 0.5, "val_fraction": 0.2}).model_dump(mode="json")
    make_run(tmp_path / "t" / "s" / "fedavg" / "seed0", seed=0, final=0.5, best=0.6, best_round=2, config=test_run)
    make_run(tmp_path / "v" / "s" / "fedavg" / "seed1", seed=1, final=0.5, best=0.6, best_round=2, config=val_run)
    md = tmp_path / "R.md"
    for folders, says, mixed in (
        (["t"], "local test data,", False), (["v"], "local validation data (samples held out", False), (["t", "v"], "local test data or local validation data", True)
    ):  # fmt: skip
        res = invoke("report", *[tmp_path / f for f in folders], "--out", md)
        assert res.exit_code == 0, res.output
        text = md.read_text()
        assert says in text
        assert ("evaluated on different splits" in text) == mixed
        assert ("Picking the best round uses test data" in text) == (folders != ["v"])
        assert ("picked on the same held-out data" in text) == (folders == ["v"])


def test_runs_outside_a_sweep_are_grouped_by_config(tmp_path):
    make_run(tmp_path / "x" / "one", seed=0, final=0.5, best=0.6, best_round=2, alpha=0.3)
    make_run(tmp_path / "x" / "two", seed=1, final=0.7, best=0.7, best_round=4, alpha=0.3)
    make_run(tmp_path / "x" / "three", seed=0, final=0.4, best=0.4, best_round=4, alpha=1.0, algorithm="local")
    col = collect([tmp_path / "x"])
    label = setting_label(json.loads((tmp_path / "x" / "one" / "config.json").read_text()))
    assert label == "synthetic-a0.3-if1"
    assert {(r.setting, r.method, r.seed) for r in col.runs} == {
        ("synthetic-a0.3-if1", "fedavg", 0), ("synthetic-a0.3-if1", "fedavg", 1), ("synthetic-a1-if1", "local", 0)
    }  # fmt: skip
    md = tmp_path / "R.md"
    res = invoke("report", tmp_path / "x" / "one", tmp_path / "x", "--out", md)  # overlapping paths: no duplicates
    assert res.exit_code == 0, res.output
    final = table(md.read_text(), "Final-round personalised accuracy (%)")
    assert final["fedavg"]["synthetic-a0.3-if1"] == expected_cell([0.5, 0.7])
    assert final["local"]["synthetic-a0.3-if1"] == "—" and final["local"]["synthetic-a1-if1"] == "40.00 (1 seed)"


def test_report_errors(tmp_path):
    res = invoke("report", tmp_path / "nope", "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "nope" in res.output
    (tmp_path / "empty").mkdir()
    res = invoke("report", tmp_path / "empty", "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "no run folders" in res.output
    res = invoke("report", tmp_path / "empty", "--out", tmp_path / "R.txt")
    assert res.exit_code == 2 and ".md" in res.output


# --- ACMU (MuPFL) clustering figure --------------------------------------------------------------


def acmu_log(rounds=(1, 2, 3, 4, 5, 6), edges=2, per_edge=6):
    log = {}
    for rnd in rounds:
        records = []
        for e in range(edges):
            clients = [e + edges * i for i in range(per_edge)]
            clusters = [i % 2 for i in range(per_edge)]
            pca = [[float(c) + 0.1 * i, float(i % 3) - rnd * 0.1] for i, c in enumerate(clusters)]
            records.append({"edge": e, "kappa": 2, "silhouette": 0.4 + 0.01 * rnd, "clients": clients,
                            "clusters": clusters, "pca": pca})  # fmt: skip
        log[rnd] = [{"round": rnd, "clients": [], "acmu": records}]
    return log


def test_acmu_records_are_read_from_rounds_log_and_bad_ones_skipped():
    log = acmu_log(rounds=(1, 2))
    log[2][0]["acmu"].append({"edge": 9, "pca": [[0, 0]], "clusters": [0, 1]})  # lengths differ: skipped
    rows = [{"round": 1, "rounds_log": log[1]}, {"round": 2, "rounds_log": log[2] + [{"round": 3}]}]
    records = acmu_records(rows)
    assert sorted(records) == [1, 2] and [r["edge"] for r in records[2]] == [0, 1]
    assert acmu_records([{"round": 1, "rounds_log": [{"round": 1, "train_loss": 0.3}]}]) == {}
    assert pick_rounds([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [1, 4, 6, 9] and pick_rounds([3, 1], 4) == [1, 3]


def test_acmu_scatter_from_a_fabricated_log(tmp_path):
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root / "s" / "mupfl-like" / f"seed{seed}", seed=seed, final=0.8, best=0.82, best_round=5, rounds=6,
                 rounds_log=acmu_log())  # fmt: skip
    make_run(root / "s" / "fedavg" / "seed0", seed=0, final=0.7, best=0.7, best_round=6, rounds=6)
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    png = tmp_path / "R-acmu-s-mupfl-like.png"
    assert png.stat().st_size > 5000
    assert "](R-acmu-s-mupfl-like.png)" in md.read_text()
    assert not list(tmp_path.glob("R-acmu-s-fedavg*"))  # runs without ACMU records get no scatter
    assert plot_acmu([{"round": 1, "rounds_log": [{"round": 1}]}], tmp_path / "none.png") is False
    assert not (tmp_path / "none.png").exists()


def test_clustered_methods_get_the_same_scatter_from_their_clustering_record(tmp_path):
    record = {"num_clusters": 2, "clients": [0, 1, 2], "clusters": [0, 1, 1], "pca": [[0, 0], [1, 1], [1, 2]]}
    rows = [{"round": r, "rounds_log": [{"round": r, "clustering": record}]} for r in (1, 2)]
    found = acmu_records(rows)
    assert sorted(found) == [1, 2]
    assert found[2][0]["kappa"] == 2 and found[2][0]["edge"] == 0 and found[2][0]["clusters"] == [0, 1, 1]
    root = tmp_path / "runs"
    make_run(root / "s" / "fedac" / "seed0", seed=0, final=0.8, best=0.8, best_round=2, rounds=2,
             rounds_log={r: row["rounds_log"] for r, row in zip((1, 2), rows)})  # fmt: skip
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "R-clusters-s-fedac.png").stat().st_size > 5000  # not MuPFL: named "clusters"
    assert "Client clustering, s / fedac / seed 0" in md.read_text()


def test_cluster_count_figure_leaves_fixed_counts_out_and_names_them(tmp_path):
    def log(counts):
        return {r: [{"round": r, "clustering": {"num_clusters": k}}] for r, k in enumerate(counts, start=1)}

    root = tmp_path / "runs"
    for name, counts in (("adaptive", [4, 2, 3, 5]), ("fixed-k80", [80] * 4), ("fixed-k20", [20] * 4)):
        make_run(root / "s" / name / "seed0", seed=0, final=0.8, best=0.8, best_round=4, rounds=4,
                 rounds_log=log(counts))  # fmt: skip
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "Not drawn, their count never changes: fixed-k20 20, fixed-k80 80." in text
    col = collect([root])
    assert plot_cluster_counts(col, tmp_path / "c.png") == [("fixed-k20", 20.0), ("fixed-k80", 80.0)]
    # with no count that changes, every method is drawn and none named
    only_fixed = tmp_path / "fixed"
    make_run(only_fixed / "s" / "k5" / "seed0", seed=0, final=0.8, best=0.8, best_round=4, rounds=4, rounds_log=log([5] * 4))
    assert plot_cluster_counts(collect([only_fixed]), tmp_path / "d.png") == []
    assert (tmp_path / "d.png").stat().st_size > 5000
    assert plot_cluster_counts(collect([root / "s" / "adaptive"]), tmp_path / "e.png") == []


# --- one section per sweep file (--sweep) --------------------------------------------------------

SWEEP_BASE = sweep_base(4, train=False)

# Two sweep files sharing one out folder, as benchmarks/mupfl/table{2,5,6}_fmnist.toml do: the run
# s-x/fedavg/seed0 is planned by both. Names are not in alphabetical order, so that the tables
# must follow the files.
SWEEP_A = """# Table A: baselines
#
# (a second paragraph, not the heading)
out = "{out}"
seeds = [0, 1]
{base}
[settings.s-y]
partition = {{ alpha = 1.0 }}
[settings.s-x]
[methods.zeta]
algorithm = "fedavg"
[methods.fedavg]
[methods.ghost]
algorithm = "local"
"""
SWEEP_B = """out = "{out}"  # shared with a.toml
# a comment after the first key is not a heading: this section is headed by the file name
seeds = [0]
{base}
[settings.s-x]
[methods.variant]
algorithm = "local"
[methods.fedavg]
"""

# (setting, method, seed) -> final accuracy; best = final + 0.01 at round 3
ACCS = {
    ("s-y", "zeta", 0): 0.61, ("s-y", "zeta", 1): 0.63, ("s-y", "fedavg", 0): 0.71, ("s-y", "fedavg", 1): 0.74,
    ("s-x", "zeta", 0): 0.52,  # s-x/zeta/seed1 is missing
    ("s-x", "fedavg", 0): 0.81, ("s-x", "fedavg", 1): 0.85,  # seed0 is shared by both files
}  # fmt: skip


@pytest.fixture
def two_sweeps(tmp_path):
    out = tmp_path / "shared"
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(SWEEP_A.format(out=out.as_posix(), base=SWEEP_BASE))
    b.write_text(SWEEP_B.format(out=out.as_posix(), base=SWEEP_BASE))
    plan = {r.dir: r for f in (a, b) for r in load_sweep(f).runs}
    for (s, m, k), final in ACCS.items():
        run = plan[out / s / m / f"seed{k}"]
        log = acmu_log(rounds=(1, 2, 3, 4)) if (s, m) == ("s-x", "fedavg") else None
        make_run(run.dir, seed=k, final=final, best=final + 0.01, best_round=3, rounds=4, rounds_log=log,
                 config=run.config_dict())  # fmt: skip
    # b.toml's variant was run with another lr than b.toml plans: stale, so not b's number
    stale = plan[out / "s-x" / "variant" / "seed0"].config_dict()
    stale["train"]["lr"] = 0.5
    make_run(out / "s-x" / "variant" / "seed0", seed=0, final=0.99, best=0.99, best_round=4, config=stale)
    # a run in the out folder that neither file plans
    make_run(out / "s-x" / "other" / "seed0", seed=0, final=0.3, best=0.3, best_round=4, algorithm="local")
    # sweep.json of the folder: written by whichever sweep ran last; it records the machine
    record = {"file": str(b), "command": f"fedtail sweep {b}", "settings": ["s-x"], "methods": ["variant", "fedavg"],
              "machine": {"platform": "TestOS-1", "cpu": "TestCPU", "cores": 64, "memory_gb": 8, "python": "3.x",
                          "torch": "9.9"}, "started": "2026-01-05T00:00:00+00:00",
              # runs of earlier invocations keep when they finished
              "runs": [{"dir": "s-x/fedavg/seed0", "status": "done", "at": "2026-01-02T03:04:05.678+00:00"},
                       {"dir": "s-x/fedavg/seed1", "status": "done", "at": "2026-01-03T10:00:00+00:00"},
                       {"dir": "s-x/variant/seed0", "status": "busy", "at": "2026-01-06T00:00:00+00:00"}]}  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(record))
    return a, b


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ")[0]


FINAL, BEST = "Final-round personalised accuracy (%)", "Best-round personalised accuracy (%)"


def test_sweep_sections_follow_their_files_and_share_runs(two_sweeps, tmp_path):
    a, b = two_sweeps
    md = tmp_path / "doc" / "R.md"
    res = invoke("report", "--sweep", a, "--sweep", b, "--out", md, "--title", "Two tables")
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert text.startswith("# Two tables")
    assert text.index("\n## Table A: baselines\n") < text.index("\n## b.toml\n")  # sections in --sweep order
    sec_a, sec_b = section(text, "Table A: baselines"), section(text, "b.toml")
    assert f"`fedtail sweep {a}`" in sec_a and f"`fedtail sweep {b}`" in sec_b

    final_a, best_a = table(sec_a, FINAL), table(sec_a, BEST)
    assert list(final_a) == ["zeta", "fedavg", "ghost"] and list(final_a["zeta"]) == ["s-y", "s-x"]
    assert final_a["fedavg"]["s-x"] == expected_cell([0.81, 0.85])  # both seeds, one of them shared
    assert final_a["zeta"]["s-x"] == expected_cell([0.52])
    assert best_a["fedavg"]["s-y"] == f"{expected_cell([0.72, 0.75])} @ r3"
    assert final_a["ghost"]["s-y"] == final_a["ghost"]["s-x"] == "—"  # planned, never run
    final_b = table(sec_b, FINAL)
    assert list(final_b) == ["variant", "fedavg"] and list(final_b["fedavg"]) == ["s-x"]
    assert final_b["fedavg"]["s-x"] == expected_cell([0.81])  # the shared run; b plans seed 0 only
    assert final_b["variant"]["s-x"] == "—"  # its folder holds a run of another config
    assert "other" not in text.split("## Costs")[0]  # planned by neither file

    inc_a = sec_a.split("### Incomplete cells", 1)[1]
    assert "`s-x` / `zeta`: 1 of 2 seeds finished; seed 1: no run folder" in inc_a
    assert "`s-y` / `ghost`: 0 of 2 seeds finished" in inc_a and "`s-x` / `fedavg`" not in inc_a
    inc_b = sec_b.split("### Incomplete cells", 1)[1]
    assert "`s-x` / `variant`: 0 of 1 seeds finished; seed 0: stale" in inc_b and "train.lr" in inc_b

    # one header (with the machine sweep.json recorded and this one) and one costs table
    assert text.count("Machine generating this report") == 1 and text.count("## Costs") == 1
    assert f"Machine of the sweep's latest start (recorded in `{tmp_path / 'shared' / 'sweep.json'}`): TestOS-1, CPU TestCPU" in text
    assert text.count("- Machines of the runs: ") == 1
    assert "- Runs finished: 2026-01-02 03:04 UTC to 2026-01-03 10:00 UTC" in text  # not the busy one
    assert "- Latest sweep invocation: 2026-01-05 00:00 UTC to 2026-01-05 00:00 UTC" in text
    costs = text.split("## Costs", 1)[1].split("\n## ")[0]
    assert "| fedavg | s-x | 2 |" in costs and costs.count("| fedavg | s-x |") == 1  # the shared run once


def test_a_diverged_run_is_named_as_such_in_its_cell_and_warning(two_sweeps, tmp_path):
    a, _ = two_sweeps
    run = next(r for r in load_sweep(a).runs if (r.setting, r.method, r.seed) == ("s-y", "ghost", 0))
    run.dir.mkdir(parents=True)
    (run.dir / "config.json").write_text(json.dumps(run.config_dict()))
    cause = "client 4: non-finite train_loss reported"
    diverged = {"algorithm": "local", "seed": 0, "status": "diverged", "diverged": {"round": 2, "cause": cause}}
    (run.dir / "summary.json").write_text(json.dumps(diverged))
    md = tmp_path / "R.md"
    res = invoke("report", "--sweep", a, "--out", md)
    assert res.exit_code == 0, res.output
    assert table(md.read_text(), FINAL)["ghost"]["s-y"] == "diverged (round 2)"
    warning = next(w for w in section(md.read_text(), "Warnings").splitlines() if str(run.dir) in w)
    assert "diverged run; its cells say so (diverged at round 2: client 4" in warning
    assert "not in the tables" not in warning


def test_sweep_sections_have_their_own_figures(two_sweeps, tmp_path):
    a, b = two_sweeps
    md = tmp_path / "R.md"
    assert invoke("report", "--sweep", a, "--sweep", b, "--out", md).exit_code == 0
    text = md.read_text()
    sec_a, sec_b = section(text, "Table A: baselines"), section(text, "b.toml")
    for name, sec in (("R-accuracy-a.png", sec_a), ("R-accuracy-b.png", sec_b)):
        assert (tmp_path / name).stat().st_size > 5000 and f"]({name})" in sec
    # the shared run's ACMU scatter is drawn once, in the first section that has it
    assert (tmp_path / "R-acmu-s-x-fedavg.png").stat().st_size > 5000
    assert "](R-acmu-s-x-fedavg.png)" in sec_a and "](R-acmu" not in sec_b
    assert "`s-x` / `fedavg` / seed 0: shown under “Table A: baselines”" in sec_b
    pngs = sorted(p.name for p in tmp_path.glob("R-*.png"))
    # the number of clusters per round is drawn for each section that has clustered runs
    assert pngs == ["R-accuracy-a.png", "R-accuracy-b.png", "R-acmu-s-x-fedavg.png",
                    "R-clusters-per-round-a.png", "R-clusters-per-round-b.png"]  # fmt: skip


def test_sweep_sections_with_reference(two_sweeps, tmp_path):
    a, b = two_sweeps
    ref = tmp_path / "ref.toml"
    ref.write_text('[reference.s-x]\nfedavg = 80.5\nvariant = 90\n[reference.s-z]\nfedavg = 1\n')
    md = tmp_path / "R.md"
    assert invoke("report", "--sweep", a, "--sweep", b, "--out", md, "--reference", ref).exit_code == 0
    text = md.read_text()
    assert table(section(text, "Table A: baselines"), FINAL)["fedavg"]["s-x (paper)"] == "80.50"
    assert "s-y (paper)" not in table(section(text, "Table A: baselines"), FINAL)["fedavg"]
    assert table(section(text, "b.toml"), BEST)["variant"]["s-x (paper)"] == "90.00"
    assert "in these sweeps: s-z / fedavg" in text

    # b.toml's section has its own paper number for the shared method (an ablation table's row)
    ref.write_text(
        ref.read_text() + "[sections.b.s-x]\nfedavg = 70.25\n[sections.a.s-q]\nzeta = 3\n[sections.nofile.s-x]\nzeta = 4\n"
    )
    assert invoke("report", "--sweep", a, "--sweep", b, "--out", md, "--reference", ref).exit_code == 0
    text = md.read_text()
    assert table(section(text, "b.toml"), FINAL)["fedavg"]["s-x (paper)"] == "70.25"
    assert table(section(text, "b.toml"), FINAL)["variant"]["s-x (paper)"] == "90.00"  # the rest still applies
    assert table(section(text, "Table A: baselines"), FINAL)["fedavg"]["s-x (paper)"] == "80.50"
    assert "a: s-q / zeta" in text and "nofile: s-x / zeta" in text  # listed as unmatched
    ref.write_text("[reference.s-x]\nfedavg = 1\n[sections.b.s-x]\nfedavg = 101\n")
    res = invoke("report", "--sweep", a, "--sweep", b, "--out", tmp_path / "bad.md", "--reference", ref)
    assert res.exit_code == 2 and "sections.b.s-x.fedavg must be a percentage" in res.output, res.output


def test_sweep_title_is_the_first_leading_comment(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("\n#\n#   Table X: things  \n#\n# more\nout = 'x'\n")
    assert sweep_title(f) == "Table X: things"  # the first paragraph only
    f.write_text("# Table Y at alpha 0.5, e.g. with IF 10. The rest wraps onto\n# the next line.\n")
    assert sweep_title(f) == "Table Y at alpha 0.5, e.g. with IF 10."
    f.write_text("# Table Z, wrapped (not\n#   mid-sentence): cut. Then more.\nout = 'x'\n")
    assert sweep_title(f) == "Table Z, wrapped (not mid-sentence): cut."
    f.write_text("# Table V at IF 10. (The caption says IF 100.)\n")
    assert sweep_title(f) == "Table V at IF 10."
    f.write_text("out = 'x'  # not a title\n# nor this\n")
    assert sweep_title(f) == "t.toml"


def test_report_needs_run_dirs_or_sweeps(two_sweeps, sweep_dir, tmp_path):
    a, _ = two_sweeps
    res = invoke("report", "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "RUN_DIRS" in res.output and "--sweep" in res.output
    res = invoke("report", sweep_dir, "--sweep", a, "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "not both" in res.output
    res = invoke("report", "--sweep", a, "--sweep", a, "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "given twice" in res.output
    res = invoke("report", "--sweep", tmp_path / "nope.toml", "--out", tmp_path / "R.md")
    assert res.exit_code == 2 and "nope.toml" in res.output
    assert not (tmp_path / "R.md").exists()


def test_fedrema_similarity_heatmaps_from_a_fabricated_log(tmp_path):
    from fedtail.report.plots import plot_similarity, similarity_records

    def record(rnd):
        s = [[1.0, 0.2 + 0.01 * rnd, 0.3], [0.2 + 0.01 * rnd, 1.0, 0.5], [0.3, 0.5, 1.0]]
        return {"round": rnd, "clients": [0, 2, 5], "S": s}

    log = {rnd: [{"round": rnd, "clients": [0, 2, 5]} | ({"fedrema_similarity": record(rnd)} if rnd in (1, 3, 6) else {})]
           for rnd in range(1, 7)}  # fmt: skip
    rows = [{"round": r, "rounds_log": log[r]} for r in range(1, 7)]
    assert [rec["round"] for rec in similarity_records(rows)] == [1, 3, 6]
    root = tmp_path / "runs"
    make_run(root / "s" / "fedrema-fedavg" / "seed0", seed=0, final=0.8, best=0.82, best_round=5, rounds=6, rounds_log=log)
    make_run(root / "s" / "fedavg" / "seed0", seed=0, final=0.7, best=0.7, best_round=6, rounds=6)
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md)
    assert res.exit_code == 0, res.output
    png = tmp_path / "R-similarity-s-fedrema-fedavg.png"
    assert png.stat().st_size > 5000 and "](R-similarity-s-fedrema-fedavg.png)" in md.read_text()
    assert not list(tmp_path.glob("R-similarity-s-fedavg*"))  # runs without S get no heatmap
    assert plot_similarity(rows[:1] and [{"round": 1, "rounds_log": [{"round": 1}]}], tmp_path / "none.png") is False


def test_a_stopped_process_shows_as_a_jump_of_elapsed_s_and_the_report_warns(tmp_path):
    from fedtail.report.analyses import stops

    steady = [{"round": r, "elapsed_s": 40.0 * r + (3.0 if r % 3 else 0.0)} for r in range(2, 42, 2)]
    assert stops(steady) == []  # load varies a round's time by seconds
    slow = [{"round": r, "elapsed_s": 40.0 * min(r, 20) + 100.0 * max(r - 20, 0)} for r in range(2, 42, 2)]
    assert stops(slow) == []  # a machine twice as busy from round 20 on is not a stop
    stopped = [dict(row, elapsed_s=row["elapsed_s"] + (1000.0 if row["round"] >= 30 else 0.0)) for row in steady]
    ((a, b, excess),) = stops(stopped)
    assert (a, b) == (28, 30) and excess == pytest.approx(1000.0, abs=5.0)
    short = [dict(row, elapsed_s=row["elapsed_s"] + (200.0 if row["round"] >= 30 else 0.0)) for row in steady]
    assert stops(short) == []  # under 300 s: not told apart from load
    root = tmp_path / "runs"
    for seed, rows in ((0, steady), (1, stopped)):
        make_run(root / "s" / "fedavg" / f"seed{seed}", seed=seed, final=0.8, best=0.8, best_round=40, rounds=40)
        path = root / "s" / "fedavg" / f"seed{seed}" / "metrics.jsonl"
        path.write_text("".join(json.dumps({"round": r["round"], "personalized_acc": 0.8, "elapsed_s": r["elapsed_s"],
                                            "rounds_log": []}) + "\n" for r in rows))  # fmt: skip
    md = tmp_path / "R.md"
    assert invoke("report", root, "--out", md).exit_code == 0
    warnings = md.read_text().split("## Warnings")[1]
    assert re.search(r"seed1: its process stood stopped \(about (99\d|100\d) s between rounds 28 and 30", warnings)
    assert "seed0" not in warnings


def test_clients_to_counts_the_seconds_until_k_clients_reach_a_level(tmp_path):
    """``--clients-to 70:2,3`` (MuPFL's Fig. 8(a)): the first evaluation where k clients reach 70 %, its seconds."""
    from fedtail.errors import FedtailError
    from fedtail.report.analyses import first_clients_at, parse_clients_to

    rows = [{"round": 2, "elapsed_s": 20.0, "per_client_acc": [0.5, 0.71, 0.2]},
            {"round": 4, "elapsed_s": 41.5, "per_client_acc": [0.7, 0.8, 0.3]},
            {"round": 6, "elapsed_s": 60.0, "per_client_acc": [0.9, 0.9, 0.75]}]  # fmt: skip
    assert first_clients_at(rows, 0.7, 1) == (20.0, 2)
    assert first_clients_at(rows, 0.7, 2) == (41.5, 4)  # 0.7 counts as reached
    assert first_clients_at(rows, 0.7, 3) == (60.0, 6) and first_clients_at(rows, 0.95, 1) is None
    assert parse_clients_to(["70:15,20,25"]) == [(70.0, (15, 20, 25))]
    for bad in ("70", "70:", "0:3", "70:a", "101:2", "70:0"):
        with pytest.raises(FedtailError, match="--clients-to takes LEVEL:K"):
            parse_clients_to([bad])
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root / "s" / "fedavg" / f"seed{seed}", seed=seed, final=0.8, best=0.8, best_round=4, rounds=4)
        path = root / "s" / "fedavg" / f"seed{seed}" / "metrics.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for row in lines:
            row["elapsed_s"] = 10.0 * row["round"] + seed
            row["per_client_acc"] = [0.9 if row["round"] >= 2 else 0.1, 0.9 if row["round"] >= 3 + seed else 0.1]
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    md = tmp_path / "R.md"
    res = invoke("report", root, "--out", md, "--clients-to", "70:1,2")
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "Time until 1, 2 clients reach 70 %" in text and "| s: 1 client | s: 2 clients |" in text
    assert "| fedavg | 20 ± 1 s (round 2.0) | 36 ± 8 s (round 3.5) |" in text  # rounds 2, 2; 3, 4
    assert "--clients-to 70:1,2" in text  # the report command is recorded
    res = invoke("report", root, "--out", md, "--clients-to", "70")
    assert res.exit_code == 2 and "--clients-to takes LEVEL:K" in res.output
