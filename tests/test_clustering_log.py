"""The clustered methods' ``clustering`` records: full every ``log_clustering_every`` rounds and at the last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.clustering import cluster_record, full_record
from fedtail.config import LOG_CLUSTERING_EVERY, RunConfig
from fedtail.components import build_config
from fedtail.errors import ConfigError
from fedtail.report.plots import acmu_records
from fedtail.report.runfiles import config_diff
from helpers import CLUSTERED_SMOKE, invoke, run, run_cli

FULL_KEYS = {"num_clusters", "clients", "clusters", "pca"}
VIEWS = {"clients", "clusters", "pca", "round_clients", "round_pca"}  # what only full records hold


def test_full_records_fall_every_k_rounds_and_at_the_last():
    config = tiny_config(rounds=7, log_clustering_every=3)
    assert [r for r in range(1, 8) if full_record(config, r)] == [3, 6, 7]
    assert all(full_record(tiny_config(rounds=7, log_clustering_every=1), r) for r in range(1, 8))
    assert [r for r in range(1, 8) if full_record(tiny_config(rounds=7, log_clustering_every=50), r)] == [7]


def test_a_light_record_keeps_the_number_of_clusters_and_the_extras_and_computes_no_view():
    calls = []

    def points():
        calls.append(1)
        return [[0.0, 1.0, 2.0], [1.0, 0.0, 2.0], [3.0, 3.0, 0.0]]

    light = cluster_record([4, 7, 9], [0, 1, 1], points, full=False, gc=[0.5, 0.25])
    assert light == {"num_clusters": 2, "gc": [0.5, 0.25]} and calls == []
    full = cluster_record([4, 7, 9], [0, 1, 1], points, gc=[0.5, 0.25])
    assert calls == [1] and set(full) == FULL_KEYS | {"gc"}
    assert full["clients"] == [4, 7, 9] and full["clusters"] == [0, 1, 1] and len(full["pca"]) == 3
    given = cluster_record([4, 7], [0, 0], view=[[1.0, 2.0], [3.0, 4.0]])
    assert given["pca"] == [[1.0, 2.0], [3.0, 4.0]] and given["num_clusters"] == 1


def test_the_default_leaves_config_json_as_it_was():
    assert "log_clustering_every" not in tiny_config().model_dump(mode="json")
    dumped = tiny_config(log_clustering_every=5).model_dump(mode="json")
    assert dumped["log_clustering_every"] == 5
    assert build_config(tiny_raw(), ["log_clustering_every=1"]).log_clustering_every == 1
    with pytest.raises(ConfigError, match="--log-clustering-every"):
        build_config(tiny_raw(log_clustering_every=0))
    # It does not change results: a finished run logged at another rate is the same run.
    assert config_diff(tiny_config().model_dump(mode="json"), dumped) == []


def test_committed_run_configs_validate_and_dump_unchanged():
    root = Path(__file__).parent.parent / "benchmarks"
    for path in sorted(root.glob("**/config.json")):
        config = RunConfig.model_validate(json.loads(path.read_text()))
        assert config.log_clustering_every == LOG_CLUSTERING_EVERY
        assert "log_clustering_every" not in config.model_dump(mode="json")
    # FedAC's runs (made after the last key added before this one): their config.json compares equal.
    paths = sorted((root / "fedac" / "runs").glob("**/config.json"))
    assert len(paths) > 20
    for path in paths:
        stored = json.loads(path.read_text())
        assert RunConfig.model_validate(stored).model_dump(mode="json") == stored, path


def without_clustering(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k != "elapsed_s"}
        kept["rounds_log"] = [{k: v for k, v in r.items() if k != "clustering"} for r in row["rounds_log"]]
        out.append(kept)
    return out


@pytest.mark.parametrize("algorithm", ["fedac", "fesem", "cgpfl"])
def test_full_records_every_k_rounds_and_the_same_run_otherwise(algorithm):
    options = {"num_clusters": 2}
    sparse, _ = run(tiny_config(algorithm=algorithm, rounds=5, options=options, log_clustering_every=2))
    every, _ = run(tiny_config(algorithm=algorithm, rounds=5, options=options, log_clustering_every=1))
    assert without_clustering(sparse) == without_clustering(every)  # logging never changes the run
    logs = {r["round"]: r["clustering"] for row in sparse for r in row["rounds_log"]}
    dense = {r["round"]: r["clustering"] for row in every for r in row["rounds_log"]}
    assert sorted(logs) == [1, 2, 3, 4, 5]
    for rnd, record in logs.items():
        if rnd in (2, 4, 5):
            assert record == dense[rnd]
        else:  # the number of clusters and the method's small entries (FedAC's G_c, CGPFL's re-clustering)
            assert record == {k: v for k, v in dense[rnd].items() if k not in VIEWS}
    if algorithm == "fedac":
        assert set(logs[1]) == {"num_clusters", "gc", "merged", "split"}


def test_the_report_reads_the_full_records_only(tmp_path):
    result = run_cli(tmp_path, "fedac", smoke=CLUSTERED_SMOKE, flags=["--rounds", "5", "--log-clustering-every", "2"])
    assert json.loads((result.out / "config.json").read_text())["log_clustering_every"] == 2
    assert sorted(acmu_records(result.rows)) == [2, 4, 5]
    md = tmp_path / "R.md"
    res = invoke("report", result.out, "--out", md)
    assert res.exit_code == 0, res.output
    scatters = [p for p in tmp_path.glob("R-clusters-*.png") if p.name != "R-clusters-per-round.png"]
    assert len(scatters) == 1  # the scatter, from the full records
    assert (tmp_path / "R-clusters-per-round.png").is_file()  # K of every round


def test_mupfl_logs_kappa_every_round_and_the_assignment_in_full_records():
    options = {"tau": 1, "match_iterations": 2, "num_features": 4}
    rows, _ = run(tiny_config(algorithm="mupfl", options=options, rounds=3, log_clustering_every=2))
    logs = {r["round"]: r["acmu"] for row in rows for r in row["rounds_log"]}
    assert all(set(rec) == {"edge", "kappa", "silhouette"} for rec in logs[1])
    assert all({"clients", "clusters", "pca"} <= set(rec) for rnd in (2, 3) for rec in logs[rnd])
    assert sorted(acmu_records(rows)) == [2, 3]
