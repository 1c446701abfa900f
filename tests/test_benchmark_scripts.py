"""Benchmark scripts that compute numbers a README quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def test_rounds_slope_reads_the_rule_and_the_slopes_from_a_run(tmp_path):
    # accuracy 50 % + 1 point per 100 rounds (rounds 5, 10, ..., 200), then flat after round 150
    rows = [{"round": r, "personalized_acc": (50 + 0.01 * min(r, 150)) / 100} for r in range(5, 201, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/fedrema/rounds_slope.py"), str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| 80-100 | 50.90 |" in out  # the mean of rounds 80, 85, ..., 100
    assert "| 180-200 | 51.50 |" in out
    assert "+0.60 points" in out
    assert "| 50-100 | 11 | 1.00 |" in out
    assert "| 150-200 | 11 | 0.00 |" in out or "| 150-200 | 11 | -0.00 |" in out  # flat: ±0 by rounding
    assert "200-250" not in out  # no window without evaluations


def _slope_run(folder: Path, rate) -> Path:
    """A run evaluated every 5 rounds to 500 whose accuracy rises by rate(r) points per 100 rounds at round r."""
    folder.mkdir(parents=True)
    acc, rows = 40.0, []
    for r in range(5, 501, 5):
        acc += rate(r) * 5 / 100
        rows.append({"round": r, "personalized_acc": acc / 100})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def _rule(*runs: Path) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/fedrema/rounds_slope.py"), *map(str, runs)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return out.rstrip().splitlines()[-1]


def test_rounds_slope_gives_table2_rounds_where_every_curve_flattens(tmp_path):
    # slope 3 to round 300, then 1: the window 250-300 rises by 3, 350-400 by 1 -> 400
    steep_then_flat = _slope_run(tmp_path / "a", lambda r: 3.0 if r <= 300 else 1.0)
    assert _rule(steep_then_flat).endswith(": 400 rounds.")
    # the limit is 1.35 per 100 rounds: 1.36 at 200 fails, 1.34 at 300 passes
    near = _slope_run(tmp_path / "b", lambda r: 1.36 if r <= 250 else 1.34)
    assert _rule(near).endswith(": 300 rounds.")
    # still steep at every candidate: the paper's 500
    steep = _slope_run(tmp_path / "c", lambda r: 10.0)
    assert _rule(steep).endswith(": 500 rounds.")
    # two runs: the first candidate flat in both, not the larger of their own answers. Run d is
    # flat at 200 and 400 only (300 steep), run e at 300 and 400 only: alone 200 and 300, together 400
    d = _slope_run(tmp_path / "d", lambda r: 1.0 if r <= 200 or 350 < r <= 400 else 3.0)
    e = _slope_run(tmp_path / "e", lambda r: 1.0 if 250 < r <= 400 else 3.0)
    assert _rule(d).endswith(": 200 rounds.") and _rule(e).endswith(": 300 rounds.")
    assert _rule(d, e).endswith(": 400 rounds.") and "in all 2 run(s)" in _rule(d, e)
    # a run that stops before round 500: no rule line
    short = tmp_path / "f"
    short.mkdir()
    (short / "metrics.jsonl").write_text(json.dumps({"round": 200, "personalized_acc": 0.5}) + "\n")
    assert "Table 2's rule" not in _rule(steep, short)


def test_rounds_slope_refuses_a_run_without_evaluations(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1}) + "\n")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/fedrema/rounds_slope.py"), str(tmp_path)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode != 0 and "no evaluated round" in res.stderr


def test_stage_classes_counts_the_classes_of_every_stage_task(tmp_path):
    stages = [{"classes": [0, 1, 2]}, {"classes": [0, 1, 2, 3]}, {"classes": [4, 5, 6, 7]}, {"classes": [1, 2, 3, 4]}]
    folder = tmp_path / "stages" / "20-4-5-if50" / "fedavg" / "seed0"
    folder.mkdir(parents=True)
    (folder / "partition.json").write_text(json.dumps({"clients": [{"stages": stages[:2]}, {"stages": stages[2:]}]}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gldp/stage_classes.py"), str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| setting | 3 classes | 4 classes |" in out
    assert "| 20-4-5-if50 | 25 % | 75 % |" in out


def _paired_run(folder: Path, per_client_rows: list[list[float]], status: str = "finished") -> None:
    folder.mkdir(parents=True)
    rows = [{"round": r, "per_client_acc": accs} for r, accs in enumerate(per_client_rows, 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "summary.json").write_text(json.dumps({"status": status}))


def test_paired_clients_counts_wins_ties_and_losses_per_seed(tmp_path):
    script = str(ROOT / "benchmarks/fedac/paired_clients.py")
    # 8 clients; A's final round beats B by 0.25 on clients 0-5, equals it on 6, loses 0.5 on 7
    # (all multiples of 1/8, exact in binary): mean diff (6 * 25 - 50) / 8 = +12.50 points
    b = [0.5] * 8
    a = [0.75] * 6 + [0.5, 0.0]
    _paired_run(tmp_path / "A" / "seed0", [[0.0] * 8, a])
    _paired_run(tmp_path / "B" / "seed0", [[0.0] * 8, b])
    out = subprocess.run([sys.executable, script, str(tmp_path), "A", "B"], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("seed0")).split()
    assert row[:6] == ["seed0", "8", "+12.50", "6", "1", "1"]
    assert 0 < float(row[6]) < 1
    # --last 2: the mean of the two rounds halves every difference
    out = subprocess.run([sys.executable, script, str(tmp_path), "A", "B", "--last", "2"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert next(line for line in out.splitlines() if line.startswith("seed0")).split()[2] == "+6.25"
    # an unfinished run is refused, not compared
    _paired_run(tmp_path / "A" / "seed1", [a], status="diverged")
    _paired_run(tmp_path / "B" / "seed1", [b])
    res = subprocess.run([sys.executable, script, str(tmp_path), "A", "B"], capture_output=True, text=True)
    assert res.returncode != 0 and "not a finished run" in res.stderr


def test_the_gpu_benchmark_runs_through_on_the_cpu(tmp_path):
    """benchmarks/gpu.py --quick on the CPU: every part runs and its checks hold (it measures nothing here)."""
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu.py"), "--device", "cpu", "--quick", "--out", str(out), "--markdown", str(md)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result = json.loads(out.read_text())
    a, b, c = result["a"], result["b"]["comparison"], result["c"]
    assert a["serial_repeat_identical"] and a["workers"]["2"]["identical_to_serial"]  # the same bits, serial or not
    assert a["efficiency_serial"] > 0 and a["transfers_per_round"]["batches"] > 0
    assert set(b) == {"fedavg", "fedproto"} and all(r["identical"] for r in b.values())  # the CPU against itself
    for name in ("FedReMa Table 1", "MuPFL Table II"):
        assert c[name]["cpu_2core"]["seconds_per_round"] > 0 and c[name]["device"][0]["seconds_per_round"] > 0
    segmentation = c["MuPFL Table III (fmnist-seg)"]  # no committed CPU run yet
    assert segmentation["device"][0]["seconds_per_round"] > 0 and segmentation["device"][1]["workers"] == 2
    text = md.read_text()
    assert "### a. Engine throughput" in text and "| fedproto |" in text and "MuPFL Table II" in text


def test_bavd_kept_records_the_mask_of_every_step_per_round(tmp_path):
    """benchmarks/mupfl/bavd_kept.py on a tiny MuPFL run with BAVD on (rescaled): fractions, factors."""
    options = {"bavd": True, "bavd_map": "batch", "bavd_mask": "map", "bavd_rescale": True,  # the lr 0.005 reading
               "num_features": 4, "tau": 1, "match_iterations": 2}  # fmt: skip
    config = tiny_config(algorithm="mupfl", rounds=2, options=options)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config.model_dump_json())
    out = tmp_path / "kept.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/mupfl/bavd_kept.py"), str(run), "--out", str(out)],
                   capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    result = json.loads(out.read_text())
    assert result["status"] == "finished" and [r["round"] for r in result["rounds"]] == [1, 2]
    for r in result["rounds"]:
        low, mid, high = r["kept_fraction_min_median_max"]
        assert r["steps"] > 0 and 0 < low <= mid <= high < 1  # the mask drops something, keeps something
        assert r["largest_rescaling_factor"] == pytest.approx(1 / low, rel=1e-2)
        assert r["largest_activation_after_mask"] >= r["largest_activation_before_mask"]  # rescaled up


def test_bavd_kept_refuses_a_run_without_bavd(tmp_path):
    (tmp_path / "config.json").write_text(tiny_config(algorithm="mupfl").model_dump_json())
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/mupfl/bavd_kept.py"), str(tmp_path)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 2 and "not a MuPFL run with BAVD on" in res.stderr
