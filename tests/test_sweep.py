"""`fedtail sweep`: plan expansion, validation before running, resuming, stale folders, jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedtail.algorithms.base import Algorithm, AlgorithmConfig
from fedtail.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedtail.components import algorithm_options
from fedtail.errors import ConfigError
from fedtail.sweep import (
    PidLock,
    RunOutcome,
    Runner,
    SweepRecord,
    busy_dirs,
    claim_path,
    config_diff,
    load_sweep,
    run_status,
)
from fedtail.cli.sweep_cmd import parse_duration
from fedtail.sweep.estimate import Estimate, borrow, describe, estimate, learned
from fedtail.sweep.status import folder_lock
from helpers import invoke, sweep_base

BASE = sweep_base(1)


def sweep_file(tmp_path: Path, body: str, out: Path | None = None, seeds: str = "[0]", name: str = "s.toml") -> Path:
    out = out or tmp_path / "runs"
    path = tmp_path / name
    path.write_text(f'out = "{out.as_posix()}"\nseeds = {seeds}\n' + BASE + body)
    return path


@pytest.fixture
def toy_algorithm():
    """An algorithm with an option, registered for the duration of one test."""

    class ToyConfig(AlgorithmConfig):
        kappa: int = 3

    Algorithm("toyopt", "test-only FedAvg with an option", FedAvgServer, FedAvgClient, config=ToyConfig)
    yield "toyopt"
    Algorithm.registry.pop("toyopt", None)


# --- plan --------------------------------------------------------------------------------------


def test_plan_is_settings_then_methods_then_seeds_with_deep_merge(tmp_path):
    path = sweep_file(
        tmp_path,
        """
[settings.a03]
partition = { alpha = 0.3 }
[settings."a1-if5"]
partition = { alpha = 1.0, imbalance = 5 }
train = { lr = 0.02 }
[methods.fedavg]
[methods.local]
[methods.fast]
algorithm = "fedavg"
train = { lr = 0.2 }
""",
        seeds="[0, 3]",
    )
    sweep = load_sweep(path)
    labels = [r.label for r in sweep.runs]
    assert labels == [
        f"{s}/{m}/seed{k}" for s in ("a03", "a1-if5") for m in ("fedavg", "local", "fast") for k in (0, 3)
    ]
    assert sweep.selected == sweep.runs and sweep.settings == ["a03", "a1-if5"]
    by = {r.label: r for r in sweep.runs}
    c = by["a1-if5/local/seed3"].config
    assert c.algorithm == "local" and c.seed == 3
    # setting merged over base key by key: alpha/imbalance replaced, the rest of base kept
    assert (c.partition.alpha, c.partition.imbalance, c.partition.num_clients, c.partition.min_samples) == (1.0, 5, 4, 3)
    assert (c.train.lr, c.train.batch_size) == (0.02, 16)
    assert by["a03/local/seed0"].config.train.lr == 0.05
    # method overrides come last: they beat the setting's lr, and keep base's batch size
    fast = by["a1-if5/fast/seed0"].config
    assert fast.algorithm == "fedavg" and fast.train.lr == 0.2 and fast.train.batch_size == 16
    assert by["a03/fast/seed3"].dir == tmp_path / "runs" / "a03" / "fast" / "seed3"


def test_method_variants_set_algorithm_and_options(tmp_path, toy_algorithm):
    path = sweep_file(
        tmp_path,
        """
[methods.toyopt]
[methods."toyopt-k2"]
algorithm = "toyopt"
options = { kappa = 2 }
""",
    )
    runs = {r.method: r.config for r in load_sweep(path).runs}
    # options are written out in full: the default where the method sets none
    assert runs["toyopt"].algorithm == "toyopt" and runs["toyopt"].options == {"kappa": 3}
    assert runs["toyopt-k2"].algorithm == "toyopt" and runs["toyopt-k2"].options == {"kappa": 2}
    assert algorithm_options(runs["toyopt-k2"]).kappa == 2 and algorithm_options(runs["toyopt"]).kappa == 3


def test_tables_accept_flag_names_like_run_config(tmp_path):
    path = sweep_file(tmp_path, "[settings.x]\nalpha = 0.7\nclients = 5\nlocal-epochs = 2\n[methods.fedavg]\n")
    c = load_sweep(path).runs[0].config
    assert (c.partition.alpha, c.partition.num_clients, c.train.local_epochs) == (0.7, 5, 2)


def test_settings_and_methods_filters(tmp_path):
    path = sweep_file(tmp_path, "[settings.a]\n[settings.b]\n[methods.fedavg]\n[methods.local]\n", seeds="[0, 1]")
    sweep = load_sweep(path, settings=["b"], methods=["local", "fedavg"])
    assert [r.label for r in sweep.selected] == ["b/fedavg/seed0", "b/fedavg/seed1", "b/local/seed0", "b/local/seed1"]
    assert len(sweep.runs) == 8
    with pytest.raises(ConfigError, match="--methods fedprocs"):
        load_sweep(path, methods=["fedprocs"])


def test_methods_may_have_their_own_seeds_and_seeds_filter(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\nseeds = [0, 1, 2]\n", seeds="[0, 1]")
    sweep = load_sweep(path)
    assert [r.label for r in sweep.runs] == [
        "default/fedavg/seed0", "default/fedavg/seed1", "default/local/seed0", "default/local/seed1", "default/local/seed2",
    ]  # fmt: skip
    assert sweep.seeds == [0, 1, 2]
    later = load_sweep(path, seeds=[2])
    assert [r.label for r in later.selected] == ["default/local/seed2"]
    assert len(later.runs) == 5  # the plan is whole; only the selection shrinks
    with pytest.raises(ConfigError, match="--seeds 7: not in the sweep file; choose from: 0, 1, 2"):
        load_sweep(path, seeds=[7])
    bad = sweep_file(tmp_path, "[methods.fedavg]\nseeds = [1, 1]\n", name="bad.toml")
    with pytest.raises(ConfigError, match=r"\[methods.fedavg\] seeds has duplicates"):
        load_sweep(bad)
    bad = sweep_file(tmp_path, "[methods.fedavg]\nseeds = []\n", name="bad2.toml")
    with pytest.raises(ConfigError, match="non-empty list"):
        load_sweep(bad)


def test_seeds_flag_of_the_command(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n", seeds="[0, 1]")
    res = invoke("sweep", path, "--seeds", "1", "--dry-run")
    assert res.exit_code == 0, res.output
    res = invoke("sweep", path, "--seeds", "x", "--dry-run")
    assert res.exit_code != 0 and "comma-separated integers" in res.output


@pytest.mark.parametrize(
    "body, needles",
    [
        ('[settings.ok]\n[settings.bad]\npartition = { alpah = 1.0 }\n[methods.fedavg]\n', ["'bad'", "alpah"]),
        ("[methods.fedavg]\n[methods.typo]\nalgorithm = \"fedavgg\"\n", ["'typo'", "fedavgg"]),
        ("[methods.fedavg]\noptions = { mu = 0.1 }\n", ["'fedavg'", "mu"]),
        ("[methods.fedavg]\ntrain = { lr = -1 }\n", ["--lr"]),
        ("[methods.fedavg]\n[base2]\nx = 1\n", ["base2", "allowed"]),
        ("[methods.fedavg]\n[settings.s]\nseed = 4\n", ["seed"]),
        ('[methods."a/b"]\n', ["a/b", "folder"]),
        ("", ["[methods.NAME]"]),
    ],
)
def test_a_typo_fails_before_anything_runs(tmp_path, body, needles):
    path = sweep_file(tmp_path, body)
    res = invoke("sweep", path)
    assert res.exit_code == 2, res.output
    assert res.output.lstrip().startswith("error:") and "Traceback" not in res.output
    for needle in needles:
        assert needle in res.output, res.output
    assert not (tmp_path / "runs").exists()  # nothing was planned to disk, nothing ran


def test_bad_seeds_and_missing_file(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n", seeds="[0, 0]")
    res = invoke("sweep", path)
    assert res.exit_code == 2 and "duplicates" in res.output
    res = invoke("sweep", tmp_path / "nope.toml")
    assert res.exit_code == 2 and "nope.toml" in res.output


def test_the_benchmark_file_plans_its_grid():
    path = Path(__file__).parent.parent / "benchmarks" / "mupfl" / "table2_fmnist.toml"
    if not path.is_file():
        pytest.skip("benchmark file not present")
    sweep = load_sweep(path, out="/nonexistent/out")
    assert len(sweep.runs) == len(sweep.settings) * len(sweep.methods) * len(sweep.seeds)
    c = sweep.runs[0].config
    assert c.partition.num_clients == 50 and c.train.local_epochs == 10


# --- status of folders on disk (fabricated: no run needed) ------------------------------------


def fake_finished(run, **config_changes) -> None:
    run.dir.mkdir(parents=True, exist_ok=True)
    config = run.config_dict()
    for key, value in config_changes.items():
        section, _, leaf = key.partition(".")
        if leaf:
            config[section][leaf] = value
        else:
            config[key] = value
    (run.dir / "config.json").write_text(json.dumps(config))
    summary = {"final": {"round": 1, "personalized_acc": 0.5}, "best": {"round": 1, "personalized_acc": 0.5}}
    (run.dir / "summary.json").write_text(json.dumps(summary))


def test_config_diff_names_keys_and_ignores_workers():
    old = {"workers": 1, "train": {"lr": 0.1, "batch_size": 16}, "seed": 0}
    new = {"workers": 4, "train": {"lr": 0.2, "batch_size": 16}, "seed": 0, "extra": 1}
    assert config_diff(old, new) == ["train.lr: 0.1 -> 0.2", "extra: (absent) -> 1"]
    assert config_diff(old, old | {"workers": 8}) == []


def test_status_done_pending_stale_and_dry_run(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n", seeds="[0, 1]")
    sweep = load_sweep(path)
    done, stale, partial, fresh = sweep.runs
    fake_finished(done, workers=3)  # workers does not change results: still done
    fake_finished(stale, **{"train.lr": 0.5})
    partial.dir.mkdir(parents=True)
    (partial.dir / "config.json").write_text(json.dumps(partial.config_dict()))
    (partial.dir / "FAILED").write_text("RuntimeError: boom\n")
    states = [run_status(r) for r in sweep.runs]
    assert [s.state for s in states] == ["done", "stale", "pending", "pending"]
    assert "train.lr: 0.5 -> 0.05" in states[1].note and "boom" in states[2].note

    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*") if p.is_file()}
    res = invoke("sweep", path, "--dry-run")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for label, state in (("fedavg", "done"), ("local", "pending")):
        assert any(label in l and state in l for l in lines), res.output
    assert "1 done, 2 pending, 1 stale" in res.output
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing cleared, no sweep.json


def test_stale_folder_is_an_error_and_is_not_overwritten(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    (run,) = load_sweep(path).runs
    fake_finished(run, **{"partition.alpha": 0.9})
    summary_before = (run.dir / "summary.json").read_text()
    res = invoke("sweep", path)
    assert res.exit_code == 2, res.output
    assert str(run.dir) in res.output and "partition.alpha" in res.output and "--force" in res.output
    assert (run.dir / "summary.json").read_text() == summary_before
    assert not list((tmp_path / "runs").rglob("*.claim"))


def test_supersede_keeps_stale_folders_apart_and_runs_them_anew(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n")
    stale, done = load_sweep(path).runs
    fake_finished(stale, **{"train.lr": 0.5})
    fake_finished(done)
    old_summary = (stale.dir / "summary.json").read_text()
    kept = tmp_path / "superseded" / "lr0.5" / "runs" / stale.dir.relative_to(tmp_path / "runs")
    # a dry run says where it would go and moves nothing
    res = invoke("sweep", path, "--dry-run", "--supersede", "lr0.5")
    assert res.exit_code == 0 and str(kept) in res.output.replace("\n", ""), res.output
    assert (stale.dir / "summary.json").read_text() == old_summary and not kept.exists()
    # --force and --supersede exclude each other; a bad tag is refused before anything moves
    assert invoke("sweep", path, "--force", "--supersede", "x").exit_code == 2
    assert invoke("sweep", path, "--supersede", "a/b").exit_code == 2
    assert (stale.dir / "summary.json").read_text() == old_summary
    # the record of the earlier sweep: the stale run's entry goes with it, the other stays
    rel_stale, rel_done = (r.dir.relative_to(tmp_path / "runs").as_posix() for r in (stale, done))
    old_at = "2026-01-01T00:00:00.000000+00:00"
    record = {"file": "old.toml", "command": "fedtail sweep old.toml", "machine": {"cores": 2},
              "runs": [{"dir": rel_stale, "status": "done", "at": old_at, "minutes": 3.0},
                       {"dir": rel_done, "status": "done", "at": old_at, "minutes": 4.0}]}  # fmt: skip
    (tmp_path / "runs" / "sweep.json").write_text(json.dumps(record))
    res = invoke("sweep", path, "--supersede", "lr0.5")
    assert res.exit_code == 0, res.output
    assert (kept / "summary.json").read_text() == old_summary  # the old run, whole, kept apart
    moved = json.loads((tmp_path / "superseded" / "lr0.5" / "runs" / "sweep.json").read_text())
    assert moved["command"] == "fedtail sweep old.toml" and moved["machine"] == {"cores": 2}
    assert moved["runs"] == [record["runs"][0]]
    live = {r["dir"]: r for r in json.loads((tmp_path / "runs" / "sweep.json").read_text())["runs"]}
    assert live[rel_stale]["at"] > old_at and "minutes" in live[rel_stale]  # the new run's entry
    assert live[rel_done]["at"] == old_at and live[rel_done]["minutes"] == 4.0
    assert json.loads((kept / "config.json").read_text())["train"]["lr"] == 0.5
    assert run_status(stale).state == "done" and run_status(done).state == "done"
    assert json.loads((stale.dir / "config.json").read_text())["train"]["lr"] == stale.config.train.lr
    # the same tag again: the target exists, so a new stale folder is not moved over it
    fake_finished(stale, **{"train.lr": 0.5})
    res = invoke("sweep", path, "--supersede", "lr0.5")
    assert res.exit_code == 2 and "exist already" in res.output, res.output
    assert run_status(stale).state == "stale"


def test_pid_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    path = tmp_path / "x.claim"
    mine = PidLock(path)
    assert mine.try_acquire() is None and mine.held
    assert PidLock(path).try_acquire() == os.getpid()  # held by a live process
    mine.release()
    assert not path.exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    again = PidLock(path)
    assert again.try_acquire() is None and json.loads(path.read_text())["pid"] == os.getpid()
    again.release()
    path.write_text("{half-writ")  # garbage: treated as left by a dead process
    assert PidLock(path).try_acquire() is None


def test_a_claim_being_written_is_never_read_half_written(tmp_path):
    # Two sweeps ran one run twice: one read a claim the other had created but not yet written,
    # and took it for a dead process's. Claims are created and written under the folder's lock.
    path = tmp_path / ".seed0.claim"
    got: list = []
    with folder_lock(tmp_path):  # another sweep between creating its claim and writing it
        path.write_text("")
        started = threading.Event()

        def take() -> None:
            started.set()
            got.append(PidLock(path).try_acquire())

        waiting = threading.Thread(target=take)
        waiting.start()
        assert started.wait(30)  # it is about to take the claim (on a loaded machine, not at once)
        waiting.join(0.3)
        assert waiting.is_alive() and not got  # blocked, not taking the empty file over
        path.write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    waiting.join(30)
    assert got == [os.getpid()]  # it sees the live holder


def test_a_run_claimed_by_another_live_sweep_is_skipped_and_left_alone(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    (run,) = load_sweep(path).runs
    claim = claim_path(run)
    assert claim == tmp_path / "runs" / "default" / "fedavg" / ".seed0.claim"
    claim.parent.mkdir(parents=True)
    claim.write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    res = invoke("sweep", path)
    assert res.exit_code == 0, res.output  # skipped is not failed
    assert f"skipped {run.dir}: another fedtail sweep (pid {os.getpid()}) is running it" in res.output
    assert "0 runs finished, 0 failed, 1 skipped" in res.output
    assert not run.dir.exists() and claim.is_file()  # the other sweep's claim is not touched
    entry = json.loads((tmp_path / "runs" / "sweep.json").read_text())["runs"][0]
    assert entry["status"] == "skipped" and "pid" in entry["note"]


def test_a_run_finished_by_another_sweep_after_planning_is_skipped(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    (run,) = load_sweep(path).runs
    fake_finished(run)
    outcome = Runner(1).run_one(run)  # planned as pending; found done when its turn came
    assert outcome.skipped == "finished by another sweep meanwhile" and not outcome.ok
    assert json.loads((run.dir / "summary.json").read_text())["final"]["personalized_acc"] == 0.5
    assert not claim_path(run).exists()
    fake_finished(run, **{"train.lr": 0.9})  # finished meanwhile with another config: stale
    assert "stale when its turn came" in Runner(1).run_one(run).skipped
    assert (run.dir / "summary.json").is_file()


def test_sweep_json_keeps_the_runs_of_other_sweep_files_sharing_the_folder(tmp_path):
    first = sweep_file(tmp_path, "[methods.fedavg]\n", name="first.toml")
    second = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n", name="second.toml")
    (shared,) = load_sweep(first).runs
    fake_finished(shared)
    record = tmp_path / "runs" / "sweep.json"
    record.parent.mkdir(exist_ok=True)
    news = {"dir": "default/fedavg/seed0", "status": "done", "minutes": 7.0, "final_personalized_acc": 0.5}
    other = {"dir": "else/x/seed0", "setting": "else", "method": "x", "seed": 0, "status": "queued"}
    record.write_text(json.dumps({"file": "first.toml", "runs": [news, other]}))
    local = load_sweep(second).runs[1]
    local.dir.mkdir(parents=True)  # a run of the second file that a third sweep is running
    claim_path(local).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    res = invoke("sweep", second)
    assert res.exit_code == 0 and "1 done, 1 to run" in res.output, res.output
    data = json.loads(record.read_text())
    by = {r["dir"]: r for r in data["runs"]}
    assert data["file"] == str(second) and set(by) == {"default/fedavg/seed0", "default/local/seed0", "else/x/seed0"}
    assert by["else/x/seed0"] == other  # another plan's run is kept as that sweep wrote it
    assert by["default/fedavg/seed0"]["minutes"] == 7.0 and by["default/fedavg/seed0"]["status"] == "done"
    assert by["default/local/seed0"]["status"] == "skipped"


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_unfinished_folder_used_by_a_live_process_is_left_alone(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    (run,) = load_sweep(path).runs
    run.dir.mkdir(parents=True)
    (run.dir / "metrics.jsonl").write_text("{}\n")
    assert run_status(run, busy_dirs()).state == "pending"
    code = "import time; print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "--out", str(run.dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # exec'd: its command line is in /proc
        status = run_status(run, busy_dirs())
    finally:
        proc.kill()
        proc.wait()
    assert status.state == "busy"


# --- real runs (each a subprocess of ~2 s) -----------------------------------------------------

TWO_RUNS = "[settings.a05]\n[methods.fedavg]\n[methods.local]\n"


def strip(obj):
    """Drop wall-clock fields so two runs can be compared exactly."""
    timing = {"elapsed_s", "wall_time_s", "suspended_s", "samples_per_s", "time_s"}
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in timing}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def results(out: Path) -> dict[str, tuple]:
    found = {}
    for summary in sorted(out.rglob("summary.json")):
        rows = [json.loads(l) for l in (summary.parent / "metrics.jsonl").read_text().splitlines()]
        found[summary.parent.relative_to(out).as_posix()] = (strip(json.loads(summary.read_text())), strip(rows))
    return found


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished 2-run sweep (1 round each) with jobs = 1."""
    tmp = tmp_path_factory.mktemp("swept")
    path = sweep_file(tmp, TWO_RUNS)
    res = invoke("sweep", path, "--jobs", "1")
    assert res.exit_code == 0, res.output
    return path, tmp / "runs", res.output


def test_sweep_runs_everything_and_writes_sweep_json(swept):
    path, out, output = swept
    assert set(results(out)) == {"a05/fedavg/seed0", "a05/local/seed0"}
    plan = json.loads((out / "sweep.json").read_text())
    assert plan["file"] == str(path) and plan["settings"] == ["a05"] and plan["methods"] == ["fedavg", "local"]
    assert [(r["dir"], r["status"]) for r in plan["runs"]] == [("a05/fedavg/seed0", "done"), ("a05/local/seed0", "done")]
    assert all(0 <= r["final_personalized_acc"] <= 1 and r["minutes"] > 0 for r in plan["runs"])
    assert "machine" in plan and plan["command"].startswith("fedtail sweep")
    assert output.count("done ") >= 2 and "final" in output and "min" in output
    assert not list(out.rglob("*.claim"))  # claims end with their runs
    log = (out / "a05" / "fedavg" / "seed0" / "run.log").read_text()
    assert re.search(r"^round 1/1: personalized_acc 0\.\d{4}, \d+ s$", log, re.M), log
    assert log.startswith("code: fedtail "), log  # the code of this piece of the run
    for run in load_sweep(path).runs:  # the written config equals the planned one
        assert run_status(run).state == "done"


def test_sweep_json_keeps_what_was_set_last_when_two_sweeps_share_runs(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n")
    sweep = load_sweep(path)
    statuses = [run_status(r) for r in sweep.runs]
    first, second = SweepRecord(sweep, statuses, "first", 1), SweepRecord(sweep, statuses, "second", 1)
    one, two = sweep.runs
    summary = {"final": {"personalized_acc": 0.5}, "best": {"personalized_acc": 0.6}}
    file = sweep.out / "sweep.json"

    def states() -> dict[str, tuple]:
        return {r["dir"]: (r["status"], r.get("minutes")) for r in json.loads(file.read_text())["runs"]}

    first.queue([one, two])
    second.queue([one, two])
    second.update(RunOutcome(one, False, 0.0, skipped="another fedtail sweep (pid 1) is running it"))
    second.update(RunOutcome(two, True, 3.0, summary))
    assert states() == {"default/fedavg/seed0": ("skipped", None), "default/local/seed0": ("done", 3.0)}
    first.update(RunOutcome(one, True, 2.0, summary))  # its entry of `two` ("queued") is older news
    assert states() == {"default/fedavg/seed0": ("done", 2.0), "default/local/seed0": ("done", 3.0)}
    first.update(RunOutcome(two, False, 0.0, summary, skipped="finished by another sweep meanwhile"))
    second.update()
    assert states() == {"default/fedavg/seed0": ("done", 2.0), "default/local/seed0": ("done", 3.0)}
    # a sweep that saw `one` busy may record its skip after the other recorded it done
    second.update(RunOutcome(one, False, 0.0, skipped="another fedtail sweep (pid 1) is running it"))
    assert states() == {"default/fedavg/seed0": ("done", 2.0), "default/local/seed0": ("done", 3.0)}
    first.update()
    assert states() == {"default/fedavg/seed0": ("done", 2.0), "default/local/seed0": ("done", 3.0)}


def test_a_sweep_with_nothing_to_run_leaves_sweep_json_alone(swept):
    path, out, _ = swept
    before = (out / "sweep.json").read_bytes()
    res = invoke("sweep", path, "--jobs", "2")
    assert res.exit_code == 0 and "2 done, 0 to run" in res.output, res.output
    assert (out / "sweep.json").read_bytes() == before  # keeps the command and times of the real sweep


def test_resume_reruns_only_the_unfinished_run(swept, tmp_path):
    path, out, _ = swept
    copy = tmp_path / "runs"
    shutil.copytree(out, copy)
    reference = results(copy)
    kept, redo = copy / "a05/fedavg/seed0/summary.json", copy / "a05/local/seed0/summary.json"
    redo.unlink()
    kept_stamp = kept.stat().st_mtime_ns
    time.sleep(0.01)
    res = invoke("sweep", path, "--out", copy)
    assert res.exit_code == 0, res.output
    assert "1 done, 1 to run" in res.output and "1 runs finished" in res.output
    assert kept.stat().st_mtime_ns == kept_stamp  # the finished run was not touched
    before = {r["dir"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    after = {r["dir"]: r for r in json.loads((copy / "sweep.json").read_text())["runs"]}
    assert after["a05/fedavg/seed0"]["at"] == before["a05/fedavg/seed0"]["at"]  # when it finished
    assert after["a05/local/seed0"]["at"] > before["a05/local/seed0"]["at"]
    assert redo.is_file()
    assert results(copy) == reference  # and the rerun reproduces the original exactly

    # a changed config makes the finished runs stale: an error, nothing overwritten
    changed = path.with_name("changed.toml")
    changed.write_text(path.read_text().replace("lr = 0.05", "lr = 0.07"))
    stamps = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()}
    res = invoke("sweep", changed, "--out", copy)
    assert res.exit_code == 2 and "train.lr: 0.05 -> 0.07" in res.output, res.output
    assert str(copy / "a05" / "fedavg" / "seed0") in res.output
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()} == stamps
    res = invoke("sweep", changed, "--out", copy, "--dry-run")
    assert res.exit_code == 0 and "0 done, 0 pending, 2 stale" in res.output, res.output


def test_two_jobs_give_the_same_results_as_one(swept, tmp_path):
    path, out, _ = swept
    res = invoke("sweep", path, "--out", tmp_path / "par", "--jobs", "2")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "par" / "sweep.json").read_text())["jobs"] == 2
    assert results(tmp_path / "par") == results(out)


def test_two_concurrent_sweeps_share_a_folder_and_run_each_run_once(swept, tmp_path):
    path, out, _ = swept
    shared = tmp_path / "shared"
    cmd = [sys.executable, "-m", "fedtail.cli.main", "sweep", str(path), "--out", str(shared), "--jobs", "1"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    text = "\n".join(outputs)
    assert text.count("done ") == 2, text  # each of the 2 runs was run by exactly one sweep
    assert "failed" not in text.replace("0 failed", "")
    assert results(shared) == results(out)  # and gives what a single sweep gives
    plan = json.loads((shared / "sweep.json").read_text())
    assert sorted(r["status"] for r in plan["runs"]) == ["done", "done"], plan["runs"]
    assert not list(shared.rglob("*.claim"))


def test_report_of_a_real_sweep(swept, tmp_path):
    path, out, _ = swept
    md = tmp_path / "R.md"
    res = invoke("report", out, "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert f"fedtail sweep {path}" in text and "| fedavg |" in text and "| local |" in text
    assert "(1 seed)" in text and (tmp_path / "R-accuracy.png").stat().st_size > 1000


def test_a_failing_run_is_reported_and_the_sweep_exits_nonzero(tmp_path):
    # validates as a config, fails when the data is cut: more clients than samples
    path = sweep_file(tmp_path, "[methods.broken]\nalgorithm = \"fedavg\"\npartition = { scheme = \"iid\", num_clients = 500 }\n")
    res = invoke("sweep", path)
    assert res.exit_code == 1, res.output
    folder = tmp_path / "runs" / "default" / "broken" / "seed0"
    assert f"failed: {folder}" in res.output and "no training" in res.output
    plan = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    assert plan["runs"][0]["status"] == "failed" and "no training" in plan["runs"][0]["error"]
    assert not (folder / "summary.json").exists()


# --- time estimates from finished runs -----------------------------------------------------------


def finished_in(run, minutes: float) -> None:
    fake_finished(run)
    summary = json.loads((run.dir / "summary.json").read_text())
    (run.dir / "summary.json").write_text(json.dumps(summary | {"wall_time_s": 60 * minutes}))


def test_estimate_uses_the_closest_finished_runs_and_the_rounds_done(tmp_path):
    body = (
        '[settings.a]\npartition = { alpha = 0.5 }\n[settings.b]\npartition = { alpha = 1.0 }\n'
        '[methods.fedavg]\n[methods.slow]\nalgorithm = "fedavg"\n[methods.local]\n'
    )
    path = sweep_file(tmp_path, body, seeds="[0, 1]")
    path.write_text(path.read_text().replace("rounds = 1", "rounds = 4"))  # a busy run's share needs rounds
    sweep = load_sweep(path)
    run = {r.label: r for r in sweep.runs}
    finished_in(run["a/fedavg/seed0"], 10)
    finished_in(run["b/fedavg/seed0"], 30)
    finished_in(run["a/slow/seed0"], 50)
    busy = run["b/slow/seed0"]
    busy.dir.mkdir(parents=True)
    records = [{"round": 1, "personalized_acc": 0.1}, {"round": 3, "personalized_acc": 0.2}]
    (busy.dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + '\n{"round": 4, "perso')
    statuses = [run_status(r, {busy.dir.resolve()}) for r in sweep.runs]
    assert statuses[sweep.runs.index(busy)].state == "busy"

    est = estimate(statuses)
    m = {label: est.minutes[r.dir] for label, r in run.items()}
    assert m["a/fedavg/seed0"] == pytest.approx(10) and m["b/fedavg/seed0"] == pytest.approx(30)  # measured
    assert m["a/fedavg/seed1"] == pytest.approx(10) and m["b/fedavg/seed1"] == pytest.approx(30)  # same method, setting
    assert m["a/slow/seed1"] == pytest.approx(50)  # same method (the algorithm's mean would be 30)
    # Same method in another setting, scaled: fedavg took 3 times as long in b as in a.
    assert m["b/slow/seed1"] == pytest.approx(150)
    assert m["b/slow/seed0"] == pytest.approx(150 * (1 - 3 / 4))  # busy: the last whole record is round 3
    assert m["a/local/seed0"] is None and est.unknown == 4  # nothing to go by
    assert est.left == pytest.approx(10 + 30 + 50 + 37.5 + 150)
    assert est.wall_hours(2) == pytest.approx(est.left / 120)
    assert "about 4.6 h of runs left (2.3 h at 2 in parallel); 4 run(s) not estimated" in describe(est, 2)

    only_a = estimate(statuses, {r.dir for r in sweep.runs if r.setting == "a"})
    assert only_a.left == pytest.approx(10 + 50) and only_a.unknown == 2


def test_runs_that_all_lack_an_estimate_are_not_described_as_zero_hours():
    text = describe(Estimate(minutes={}, left=0.0, unknown=3), 2)
    assert "0.0 h" not in text and "no estimate: 3 run(s) left" in text
    assert describe(Estimate(minutes={}, left=0.0, unknown=0), 2) == "nothing left to run"


def test_times_from_another_instruction_set_are_scaled_to_this_machine(tmp_path):
    def ran_on(run, minutes, *caps):
        finished_in(run, minutes)
        summary = json.loads((run.dir / "summary.json").read_text())
        pieces = [{"from_round": 1 + i, "cpu_capability": c} for i, c in enumerate(caps)]
        (run.dir / "summary.json").write_text(json.dumps(summary | {"pieces": pieces}))

    body = '[methods.fedavg]\n[methods.prox]\nalgorithm = "fedprox"\n'
    sweep = load_sweep(sweep_file(tmp_path, body, seeds="[0, 1, 2, 3]"))
    run = {r.label: r for r in sweep.runs}
    ran_on(run["default/fedavg/seed0"], 20, "AVX2")
    ran_on(run["default/fedavg/seed1"], 10, "AVX512")  # the same work took half as long with AVX-512
    ran_on(run["default/prox/seed0"], 30, "AVX2")  # FedProx only ever timed on AVX2
    statuses = [run_status(r, set()) for r in sweep.runs]

    on_512 = learned(statuses, capability="AVX512")
    assert on_512.expect(run["default/fedavg/seed2"]) == pytest.approx(10)  # (20 / 2 + 10) / 2
    assert on_512.expect(run["default/prox/seed1"]) == pytest.approx(15)  # AVX2's 30, at FedAvg's ratio
    on_2 = learned(statuses, capability="AVX2")
    assert on_2.expect(run["default/fedavg/seed2"]) == pytest.approx(20)
    assert on_2.expect(run["default/prox/seed1"]) == pytest.approx(30)
    unpaired = learned(statuses, capability="VSX")  # nothing timed here: the minutes as they are
    assert unpaired.expect(run["default/fedavg/seed2"]) == pytest.approx(15)

    # a run in pieces on both sets is taken as it is, and sets no ratio
    ran_on(run["default/prox/seed1"], 100, "AVX2", "AVX512")
    statuses = [run_status(r, set()) for r in sweep.runs]
    assert learned(statuses, capability="AVX512").expect(run["default/prox/seed2"]) == pytest.approx((15 + 100) / 2)
    assert estimate(statuses, times=learned(statuses, capability="AVX512")).minutes[
        run["default/fedavg/seed0"].dir
    ] == pytest.approx(20)  # a finished run's own time stays measured


def test_a_setting_factor_scales_guesses_from_other_settings(tmp_path):
    body = "".join(f"[settings.{name}]\npartition = {{ alpha = {a} }}\n" for name, a in [("a", 0.5), ("b", 1.0), ("c", 2.0)])
    body += '[methods.fedavg]\n[methods.slow]\nalgorithm = "fedavg"\n[methods.other]\nalgorithm = "fedavg"\n'
    sweep = load_sweep(sweep_file(tmp_path, body))
    run = {r.label: r for r in sweep.runs}
    finished_in(run["a/fedavg/seed0"], 10)
    finished_in(run["b/fedavg/seed0"], 5)  # b: runs take half as long
    finished_in(run["a/slow/seed0"], 40)
    times = learned([run_status(r, set()) for r in sweep.runs])
    assert times.setting_factor("b") == pytest.approx(0.5) and times.setting_factor("c") == 1.0
    assert times.expect(run["b/slow/seed0"]) == pytest.approx(20)  # same method elsewhere x 0.5
    assert times.expect(run["c/slow/seed0"]) == pytest.approx(40)  # nothing timed in c: unscaled
    assert times.expect(run["b/other/seed0"]) == pytest.approx(5)  # same algorithm, same setting
    assert times.expect(run["c/other/seed0"]) == pytest.approx((10 + 5 + 40) / 3)  # same algorithm elsewhere


def test_dry_run_shows_minutes_and_the_time_left(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n", seeds="[0, 1]")
    sweep = load_sweep(path)
    finished_in(sweep.runs[0], 12.34)
    res = invoke("sweep", path, "--dry-run", "--jobs", "2")
    assert res.exit_code == 0, res.output
    cells = [[c.strip() for c in line.split("│")] for line in res.output.splitlines() if line.count("│") == 8]
    rows = {c[3] + c[4]: c[7] for c in cells}  # method + seed -> min
    assert rows == {"fedavg0": "12.3", "fedavg1": "~12", "local0": "?", "local1": "?"}
    assert "about 0.2 h of runs left (0.1 h at 2 in parallel); 2 run(s) not estimated" in res.output
    everything = sweep_file(tmp_path, "[methods.fedavg]\n", name="one.toml")
    finished_in(load_sweep(everything).runs[0], 1)
    assert "nothing left to run" in invoke("sweep", everything, "--dry-run").output


def test_times_from_other_folders_are_the_last_resort_per_round_and_calibrated(tmp_path):
    # Another sweep's finished runs: fedavg at 0.5 min a round (one at 10 rounds, 5 min), local at 2.
    other = tmp_path / "validation"
    timed = [("a", "fedavg", 5.0, 10), ("b", "local", 40.0, 20), ("c", "fedavg", 99.0, 10)]
    for name, algorithm, minutes, rounds in timed:
        (other / name).mkdir(parents=True)
        status = "diverged" if name == "c" else "finished"  # a diverged run stopped early: no time to go by
        summary = {"algorithm": algorithm, "rounds": rounds, "wall_time_s": 60 * minutes, "status": status}
        (other / name / "summary.json").write_text(json.dumps(summary))
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n[methods.fedprox]\n", seeds="[0, 1]")
    path.write_text(path.read_text().replace("rounds = 1", "rounds = 4"))
    sweep = load_sweep(path)
    run = {r.label: r for r in sweep.runs}
    statuses = [run_status(r, set()) for r in sweep.runs]

    times = learned(statuses)
    assert borrow(times, [other]) == 2
    est = estimate(statuses, times=times)
    m = {label: est.minutes[r.dir] for label, r in run.items()}
    assert m["default/fedavg/seed0"] == pytest.approx(0.5 * 4)  # per round there, times the rounds here
    assert m["default/local/seed1"] == pytest.approx(2.0 * 4)
    assert m["default/fedprox/seed0"] is None  # no fedprox run anywhere
    assert (est.borrowed, est.unknown) == (4, 2)
    assert "4 run(s) estimated from the runs of --times-from folders" in describe(est, 1)

    # A finished fedavg run here took 3 min (0.75 a round, 1.5 times the other folder's): the
    # sweep's own fedavg runs go by it, and the borrowed local guesses are scaled by 1.5.
    finished_in(run["default/fedavg/seed0"], 3.0)
    statuses = [run_status(r, set()) for r in sweep.runs]
    times = learned(statuses)
    borrow(times, [other])
    assert times.others_factor() == pytest.approx(1.5)
    est = estimate(statuses, times=times)
    assert est.minutes[run["default/fedavg/seed1"].dir] == pytest.approx(3.0)
    assert est.minutes[run["default/local/seed0"].dir] == pytest.approx(2.0 * 4 * 1.5)
    assert est.borrowed == 2


def test_runs_of_an_algorithm_with_other_cost_settings_give_only_rough_guesses(tmp_path):
    # Three methods of one algorithm: "sparse" evaluates every 2nd round, so its cost settings
    # differ from the finished "every" run's; "twin" shares them.
    body = '[methods.every]\nalgorithm = "fedavg"\n[methods.twin]\nalgorithm = "fedavg"\n'
    body += '[methods.sparse]\nalgorithm = "fedavg"\neval_every = 2\n'
    path = sweep_file(tmp_path, body)
    path.write_text(path.read_text().replace("rounds = 1", "rounds = 4"))
    sweep = load_sweep(path)
    run = {r.method: r for r in sweep.runs}
    finished_in(run["every"], 10.0)
    statuses = [run_status(r, set()) for r in sweep.runs]
    times = learned(statuses)
    assert times.guess(run["twin"]) == (pytest.approx(10.0), False, False)
    assert times.guess(run["sparse"]) == (pytest.approx(10.0), False, True)  # still a guess, but rough
    est = estimate(statuses, times=times)
    assert (est.rough, est.unknown) == ({run["sparse"].dir}, 0)
    assert "1 run(s) estimated roughly (~N?), from runs of their algorithm with other options" in describe(est, 1)
    res = invoke("sweep", path, "--dry-run")
    cells = [[c.strip() for c in line.split("│")] for line in res.output.splitlines() if line.count("│") == 8]
    assert {c[3]: c[7] for c in cells} == {"every": "10.0", "twin": "~10", "sparse": "~10?"}

    # Another folder's run with the same cost settings as "sparse" (its config.json says so) beats
    # this folder's rough guess: 1 min a round there, times 4 rounds.
    other = tmp_path / "validation" / "x"
    other.mkdir(parents=True)
    summary = {"algorithm": "fedavg", "rounds": 2, "wall_time_s": 120.0, "status": "finished"}
    (other / "summary.json").write_text(json.dumps(summary))
    (other / "config.json").write_text(json.dumps(run["sparse"].config_dict()))
    times = learned(statuses)
    borrow(times, [tmp_path / "validation"])
    # Calibration compares alike runs only: "every" (2.5 min a round) is not like the run there.
    assert times.others_factor() == pytest.approx(1.0)
    guessed = times.guess(run["sparse"])
    assert guessed.borrowed and not guessed.rough and guessed.minutes == pytest.approx(4.0)
    # The same run with other cost settings there is only a rough last resort for "twin"'s kind.
    (other / "config.json").write_text(json.dumps(run["every"].config_dict() | {"options": {"x": 1}}))
    times = learned([run_status(r, set()) for r in sweep.runs if r.method == "sparse"])  # nothing finished here
    borrow(times, [tmp_path / "validation"])
    guessed = times.guess(run["sparse"])
    assert guessed.borrowed and guessed.rough and guessed.minutes == pytest.approx(4.0)


def test_times_from_a_missing_or_empty_folder_is_an_error(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    (tmp_path / "empty").mkdir()
    for folder, message in [(tmp_path / "nowhere", "not a folder"), (tmp_path / "empty", "no finished run")]:
        res = invoke("sweep", path, "--dry-run", "--times-from", folder)
        assert res.exit_code != 0 and message in res.output, res.output
    assert not (tmp_path / "runs").exists()  # nothing written


def test_dry_run_with_times_from_shows_the_borrowed_guesses(tmp_path):
    first = sweep_file(tmp_path, "[methods.fedavg]\n", out=tmp_path / "first", name="first.toml")
    finished_in(load_sweep(first).runs[0], 6.0)
    (tmp_path / "first" / "default" / "fedavg" / "seed0" / "summary.json").write_text(
        json.dumps({"algorithm": "fedavg", "rounds": 1, "wall_time_s": 360.0, "status": "finished"})
    )
    body = '[methods.plain]\nalgorithm = "fedavg"\n'
    second = sweep_file(tmp_path, body, out=tmp_path / "second", name="second.toml")
    res = invoke("sweep", second, "--dry-run", "--times-from", tmp_path / "first")
    assert res.exit_code == 0, res.output
    assert "~6" in res.output and "1 run(s) estimated from the runs of --times-from folders" in res.output


@pytest.mark.parametrize("text,minutes", [("90", 90), ("90m", 90), ("45 min", 45), ("2h", 120), ("1h30m", 90), ("1.5h", 90)])
def test_time_limit_accepts_minutes_and_hours(text, minutes):
    assert parse_duration(text) == minutes


@pytest.mark.parametrize("text", ["", "abc", "0", "0h", "-5", "2d", "h", "1h30s"])
def test_a_bad_time_limit_is_an_error_before_anything_runs(tmp_path, text):
    with pytest.raises(ConfigError, match="--time-limit"):
        parse_duration(text)
    path = sweep_file(tmp_path, "[methods.fedavg]\n")
    res = invoke("sweep", path, "--time-limit", text)
    assert res.exit_code == 2 and "--time-limit" in res.output, res.output
    assert not (tmp_path / "runs").exists()


def test_time_limit_defers_runs_expected_to_end_late_and_starts_those_that_fit(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n[methods.local]\n", seeds="[0, 1]")
    sweep = load_sweep(path)
    finished_in(sweep.runs[0], 500)  # fedavg seed 0 "took" 500 min: seed 1 cannot fit in 30
    res = invoke("sweep", path, "--time-limit", "30m")
    assert res.exit_code == 0, res.output
    assert "deferred" in res.output and "~500 min" in res.output
    assert "2 runs finished, 0 failed, 1 deferred" in res.output
    late, *fitted = sweep.runs[1:]
    assert not late.dir.exists()  # never started: still pending for the next sweep
    assert all((r.dir / "summary.json").is_file() for r in fitted)  # nothing known of local: started
    entries = {e["dir"]: e for e in json.loads((sweep.out / "sweep.json").read_text())["runs"]}
    entry = entries["default/fedavg/seed1"]
    assert entry["status"] == "deferred" and "time limit" in entry["note"]
    assert "--time-limit 30m" in json.loads((sweep.out / "sweep.json").read_text())["command"]
    assert "3 done, 1 pending" in invoke("sweep", path, "--dry-run").output


def test_a_runner_past_its_deadline_starts_nothing_and_learns_from_what_it_runs(tmp_path):
    path = sweep_file(tmp_path, "[methods.fedavg]\n", seeds="[0, 1]")
    first, second = load_sweep(path).runs
    outcome = Runner(1, deadline=time.monotonic() - 1).run_one(first)
    assert outcome.deferred == "the time limit has passed" and not outcome.ok and not first.dir.exists()
    runner = Runner(1, deadline=time.monotonic() + 3600)
    assert runner.times.expect(second) is None
    (done,) = runner.map([first], lambda o: None)
    assert done.ok and runner.times.expect(second) == pytest.approx(done.minutes)


def test_a_diverged_run_is_recorded_kept_and_rerun_only_when_asked(tmp_path):
    # lr 1e12 makes the first local step non-finite: that run diverges in round 1
    body = "[settings.a05]\n[methods.fedavg]\n[methods.wild]\nalgorithm = \"fedavg\"\ntrain = { lr = 1e12 }\n"
    path = sweep_file(tmp_path, body)
    res = invoke("sweep", path, "--jobs", "1")
    assert res.exit_code == 0, res.output  # a diverged run is a result, not a failure of the sweep
    assert "diverged" in res.output and "1 diverged" in res.output
    plan = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    status = {r["dir"]: (r["status"], r.get("note", "")) for r in plan["runs"]}
    assert status["a05/fedavg/seed0"][0] == "done"
    assert status["a05/wild/seed0"][0] == "diverged" and status["a05/wild/seed0"][1].startswith("diverged at round 1:")
    wild = next(r for r in load_sweep(path).runs if r.method == "wild")
    assert run_status(wild).state == "diverged"
    before = (wild.dir / "summary.json").stat().st_mtime_ns
    res = invoke("sweep", path, "--jobs", "1")  # nothing to run: the diverged run is kept
    assert res.exit_code == 0 and (wild.dir / "summary.json").stat().st_mtime_ns == before
    res = invoke("sweep", path, "--jobs", "1", "--rerun-diverged", "--compress")
    assert res.exit_code == 0 and (wild.dir / "summary.json").stat().st_mtime_ns != before
    assert (wild.dir / "partition.json.gz").is_file() and not (wild.dir / "partition.json").exists()  # final: compressed
    plain = next(r for r in load_sweep(path).runs if r.method == "fedavg").dir  # finished before --compress
    assert sorted(p.name for p in plain.glob("*.gz")) == ["metrics.jsonl.gz", "partition.json.gz"]
    assert not (plain / "metrics.jsonl").exists()

    report = tmp_path / "report.md"
    res = invoke("report", "--sweep", path, "--out", report)
    assert res.exit_code == 0, res.output
    row = next(line for line in report.read_text().splitlines() if line.startswith("| wild "))
    assert "diverged (round 1)" in row and "%" not in row


def test_an_optional_setting_added_later_keeps_older_runs_done():
    old = {"train": {"lr": 0.1}, "seed": 0}
    assert config_diff(old, {"train": {"lr": 0.1, "local_steps": None}, "seed": 0}) == []
    assert config_diff({"train": {"lr": 0.1, "local_steps": None}}, {"train": {"lr": 0.1}}) == []
    assert config_diff(old, {"train": {"lr": 0.1, "local_steps": 5}, "seed": 0}) == ["train.local_steps: (absent) -> 5"]
