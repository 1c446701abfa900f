"""Checkpoints and resume: a run stopped after a checkpoint and resumed ends exactly as one never stopped."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

from conftest import tiny_config
from fedtail.algorithms import ALGORITHMS
from fedtail.engine import checkpoint, prepare
from fedtail.engine.callbacks import Checkpointer, OnRound
from fedtail.engine.checkpoint import CheckpointError, decode, encode
from fedtail.engine.simulation import Simulation
from fedtail.report.runfiles import CHECKPOINT, CHECKPOINT_INFO
from fedtail.runner import run_to_folder
from helpers import PACKAGED, SMOKE, algorithm_config, invoke, same, staged, strip_timing, sweep_base

TIMING = ("wall_time_s", "suspended_s", "time_s", "samples_per_s", "pieces")  # pieces: which process ran which rounds


def no_timing(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMING}


def through_a_file(value):
    """``value`` written in a checkpoint and read back (``torch.load(weights_only=True)``)."""
    state = {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "v": value}
    return checkpoint.load(checkpoint.to_bytes(state))["v"]


# --- plain containers ---------------------------------------------------------------------------


def test_states_round_trip_through_a_weights_only_file():
    generator = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(5)
    pca = PCA(n_components=2, random_state=0).fit(np.random.default_rng(0).normal(size=(6, 4)))
    state = {
        "w": torch.arange(6.0).reshape(2, 3),
        "labels": np.array([2, 0, 1]),
        "mask": np.array([[True, False]]),
        "u32": np.arange(4, dtype=np.uint32),
        "zero_d": np.array(1.5),
        "scalar": np.float32(0.25),
        "count": np.int64(7),
        "by_client": {np.int64(3): [1.0, None, "x"], 4: (1, 2)},
        "members": {1, 2},
        "nan": float("nan"),
        "gen": generator,
        "rng": rng,
        "pca": pca,
        "tricky": {"__fedtail__": "not a tag"},
    }
    loaded = decode(through_a_file(encode(state)))
    for key in ("w", "labels", "mask", "u32", "zero_d"):
        assert same(loaded[key], state[key]), key
    assert type(loaded["scalar"]) is np.float32 and loaded["scalar"] == 0.25 and type(loaded["count"]) is np.int64
    assert loaded["by_client"] == {3: [1.0, None, "x"], 4: (1, 2)} and type(next(iter(loaded["by_client"]))) is np.int64
    assert loaded["members"] == {1, 2} and math.isnan(loaded["nan"]) and loaded["tricky"] == state["tricky"]
    # random generators continue their streams exactly
    assert torch.equal(torch.rand(3, generator=loaded["gen"]), torch.rand(3, generator=generator))
    assert np.array_equal(loaded["rng"].random(3), rng.random(3))
    # a fitted scikit-learn estimator keeps its fitted arrays and still works
    x = np.random.default_rng(1).normal(size=(3, 4))
    assert type(loaded["pca"]) is PCA and np.array_equal(loaded["pca"].transform(x), pca.transform(x))


def test_anything_else_is_refused_naming_where_it_sits():
    with pytest.raises(CheckpointError, match=r"server\['model'\] is a torch.nn.modules.linear.Linear"):
        encode({"model": torch.nn.Linear(2, 2)}, "server")
    with pytest.raises(CheckpointError, match="Python objects"):
        encode(np.array([object()]), "x")
    with pytest.raises(CheckpointError, match="not a fedtail checkpoint"):
        checkpoint.load(checkpoint.to_bytes({"format": "other"}))
    with pytest.raises(CheckpointError, match="format version 0, not 1"):
        checkpoint.load(checkpoint.to_bytes({"format": checkpoint.FORMAT, "version": 0}))


def test_global_random_streams_are_restored():
    state = checkpoint.rng_state()
    expected = (torch.rand(2), np.random.random(2), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    checkpoint.set_rng_state(through_a_file(state))
    got = (torch.rand(2), np.random.random(2), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


# --- every algorithm, in memory: checkpoint after 2 rounds, resume, compare with 4 rounds ---------

def stopped_and_resumed(
    config, resume_workers: int | None = None, at: int = 2
) -> tuple[Simulation, dict, Simulation, dict]:
    """An uninterrupted run (its one checkpoint taken after round ``at``) and a new simulation resumed from it."""
    saved: list[bytes] = []
    reference = Simulation(config, *prepare(config), callbacks=[Checkpointer(lambda s: saved.append(checkpoint.to_bytes(s)))])
    ref_summary = reference.run()
    assert len(saved) == 1  # after round `at`; none after the last round
    torch.manual_seed(12345), np.random.seed(12345)  # another process's streams: the checkpoint restores them
    if resume_workers is not None:
        config = config.model_copy(update={"workers": resume_workers})
    resumed = Simulation(config, *prepare(config))
    resumed.restore(checkpoint.load(saved[0]))
    assert resumed.rounds_done == at
    assert strip_timing(resumed.record.rows) == strip_timing([r for r in reference.record.rows if r["round"] <= at])
    return reference, ref_summary, resumed, resumed.run()


def assert_same_run(reference: Simulation, ref_summary: dict, resumed: Simulation, summary: dict) -> None:
    assert strip_timing(resumed.record.rows) == strip_timing(reference.record.rows)
    assert no_timing(summary) == no_timing(ref_summary)
    assert same(encode(resumed.server.state_dict()), encode(reference.server.state_dict()))
    assert same(encode(dict(resumed.client_state)), encode(dict(reference.client_state)))
    assert resumed.meter.samples_trained == reference.meter.samples_trained


@pytest.mark.parametrize("name", PACKAGED)
def test_every_algorithm_resumes_bit_identically(name):
    assert_same_run(*stopped_and_resumed(algorithm_config(name)))


@pytest.mark.parametrize(
    "bavd",
    [
        {"bavd_map": "epoch", "bavd_rescale": False, "bavd_eval": True},  # the per-client map is used at evaluation
        {"bavd_map": "round", "bavd_mask": "value"},
        {"bavd_map": "batch"},
    ],
)
def test_mupfl_with_bavd_resumes_bit_identically(bavd):
    """BAVD's maps live in each client's state: a resumed run masks with the maps it was stopped with."""
    config = algorithm_config("mupfl")
    config = config.model_copy(update={"options": config.options | {"bavd": True} | bavd})
    assert_same_run(*stopped_and_resumed(config))


@pytest.mark.parametrize("name", ["ditto", "mupfl", "fedac"])
def test_client_state_on_disk_runs_checkpoints_and_resumes_as_in_memory(name):
    from fedtail.engine.states import DiskStates

    memory = Simulation(algorithm_config(name), *prepare(algorithm_config(name)))
    memory.run()
    reference, ref_summary, resumed, summary = stopped_and_resumed(algorithm_config(name, client_state="disk"))
    assert isinstance(reference.client_state, DiskStates) and isinstance(resumed.client_state, DiskStates)
    assert strip_timing(reference.record.rows) == strip_timing(memory.record.rows)
    assert strip_timing(resumed.record.rows) == strip_timing(reference.record.rows)
    assert no_timing(summary) == no_timing(ref_summary)
    assert not reference.client_state.dir.exists() and not resumed.client_state.dir.exists()  # removed at the end


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_store_accepts_a_held_state_once_and_forgets_a_dropped_one(tmp_path, kind):
    """The one protocol of every client-state store (engine/states.py): hold, accept, drop."""
    from fedtail.engine.states import ClientStates, make_states

    store = make_states(kind, tmp_path)
    assert isinstance(store, ClientStates) and store.get(1, {}) == {}
    store.hold(1, {"w": torch.ones(2)}, (3, 0))
    assert 1 not in store and not store.accept(1, (3, 1))  # pending only; another call's tag
    assert store.accept(1, (3, 0)) and torch.equal(store[1]["w"], torch.ones(2))
    store.hold(1, {"w": torch.zeros(2)})
    store.drop(1)
    assert not store.accept(1, (4, 0)) and torch.equal(store[1]["w"], torch.ones(2))
    store.hold(2, {"n": 5})
    assert store.accept(2) and list(store) == [1, 2]  # untagged: accepted as held
    store.close()


def test_disk_states_read_copies_and_reject_writes_after_close(tmp_path):
    from fedtail.engine.states import DiskStates

    store = DiskStates(tmp_path / "s")
    store[3] = {"personal": {"w": torch.ones(2)}, "gen": np.random.default_rng(0), "n": 1}
    store[1] = {}
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "s").iterdir()} == {0o600}  # personal models
    assert list(store) == [1, 3] and len(store) == 2 and 3 in store and 2 not in store
    got = store[3]
    got["personal"]["w"] += 1
    assert torch.equal(store[3]["personal"]["w"], torch.ones(2))  # a read is a copy
    assert store.get(7, "none") == "none"
    del store[1]
    assert list(store) == [3]
    store.close()
    assert not (tmp_path / "s").exists() and len(store) == 0
    with pytest.raises(RuntimeError, match="closed"):
        store[0] = {}


@pytest.mark.parametrize("name", ["gldp", "fedavg"])
def test_nested_stage_runs_resume_bit_identically_inside_a_round_of_global_optimisation(name):
    # 3 stage tasks, 2 rounds of global optimisation of 3 rounds; the checkpoint after round 4 falls
    # inside the second: GLDP's previous-stage body and prototypes, FedAvg's kept local models
    config = staged(algorithm=name, stage_schedule=None, rounds=6, checkpoint_every=4,
                    options={"head_epochs": 1} if name == "gldp" else {})  # fmt: skip
    reference, ref_summary, resumed, summary = stopped_and_resumed(config, at=4)
    assert [r["round"] for r in reference.record.rows] == [3, 6]
    assert any("old_shared" in s or "engine.local_model" in s for s in resumed.client_state.values())
    assert_same_run(reference, ref_summary, resumed, summary)


def test_pending_round_logs_and_two_workers_resume_bit_identically():
    # evaluations at rounds 3 and 4: the checkpoint after round 2 carries two rounds' logs;
    # a serial run's checkpoint resumed with two worker processes
    config = tiny_config(algorithm="ditto", rounds=4, checkpoint_every=2, eval_every=3)
    reference, ref_summary, resumed, summary = stopped_and_resumed(config, resume_workers=2)
    assert [r["round"] for r in resumed.record.rows] == [3, 4]
    assert [log["round"] for log in resumed.record.rows[0]["rounds_log"]] == [1, 2, 3]
    assert_same_run(reference, ref_summary, resumed, summary)


def test_checkpointing_does_not_change_the_run():
    config = tiny_config(algorithm="ifca", rounds=3, checkpoint_every=1)
    saved = []
    with_checkpoints = Simulation(config, *prepare(config), callbacks=[Checkpointer(saved.append)])
    summary = with_checkpoints.run()
    plain_config = config.model_copy(update={"checkpoint_every": 0})
    plain = Simulation(plain_config, *prepare(plain_config), callbacks=[Checkpointer(saved.append)])
    assert no_timing(plain.run()) == no_timing(summary)
    assert [s["round"] for s in saved] == [1, 2]  # none after the last round, none with 0
    assert strip_timing(plain.record.rows) == strip_timing(with_checkpoints.record.rows)


# --- run folders: stopped runs resume from checkpoint.pt ----------------------------------------


class Stop(Exception):
    pass


def stop_after(last: int):
    def on_round(rnd, row):
        if rnd == last:
            raise Stop  # like Ctrl-C or the end of a session, after round `last`

    return [OnRound(on_round)]


def folder(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return no_timing(summary), strip_timing(rows)


@pytest.mark.parametrize(
    "name, overrides",
    [("fedavg", {"eval_every": 2}), ("ditto", {}), ("fedac", {})],
)
def test_a_stopped_run_folder_resumes_to_the_same_files(tmp_path, name, overrides):
    config = tiny_config(algorithm=name, rounds=5, checkpoint_every=2, **overrides)
    reference = run_to_folder(config, tmp_path / "ref")
    out = tmp_path / "cut"
    with pytest.raises(Stop):
        run_to_folder(config, out, stop_after(3))  # checkpoint after round 2, stopped after 3
    info = json.loads((out / CHECKPOINT_INFO).read_text())
    assert info["round"] == 2 and info["rounds"] == 5 and info["bytes"] == (out / CHECKPOINT).stat().st_size
    assert (out / "FAILED").is_file() and not (out / "summary.json").exists()
    starts = []
    summary = run_to_folder(config, out, [OnRound(lambda rnd, row: starts.append(rnd))], resume=None)  # auto
    assert starts[:2] == [2, 3]  # the progress starts at the checkpoint
    assert no_timing(summary) == no_timing(reference)
    assert folder(out) == folder(tmp_path / "ref")  # metrics.jsonl lost the stopped run's round-3 row
    # each piece names the machine it ran on, from the round it began with
    assert [p["from_round"] for p in reference["pieces"]] == [1]
    assert [p["from_round"] for p in summary["pieces"]] == [1, 3]
    assert all(p["cpu_capability"] == summary["machine"]["cpu_capability"] for p in summary["pieces"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.jsonl", "partition.json", "summary.json"]


def test_a_checkpoint_without_pieces_resumes_with_its_first_machine_unknown(tmp_path):
    config = tiny_config(rounds=3, checkpoint_every=1)
    with pytest.raises(Stop):
        run_to_folder(config, tmp_path, stop_after(2))
    state = checkpoint.load(tmp_path / CHECKPOINT)
    assert [p["from_round"] for p in state["pieces"]] == [1]
    del state["pieces"]  # as written by a fedtail that did not record them
    (tmp_path / CHECKPOINT).write_bytes(checkpoint.to_bytes(state))
    summary = run_to_folder(config, tmp_path, resume=True)
    assert [(p["from_round"], p["cpu_capability"]) for p in summary["pieces"]] == [
        (1, None),
        (state["round"] + 1, summary["machine"]["cpu_capability"]),
    ]


def test_a_checkpoint_is_readable_by_its_owner_only_even_over_a_left_temporary_file(tmp_path):
    config = tiny_config(rounds=3, checkpoint_every=1)
    stale = tmp_path / (CHECKPOINT + ".tmp")  # as a write killed midway leaves it, world-readable
    stale.write_bytes(b"partial")
    stale.chmod(0o644)
    with pytest.raises(Stop):
        run_to_folder(config, tmp_path, stop_after(2))
    assert (tmp_path / CHECKPOINT).stat().st_mode & 0o777 == 0o600
    assert not stale.exists()
    assert checkpoint.load(tmp_path / CHECKPOINT)["round"] == 2


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    config = tiny_config(rounds=3, checkpoint_every=1)
    with pytest.raises(Stop):
        run_to_folder(config, tmp_path, stop_after(1))
    other = tiny_config(rounds=3, checkpoint_every=1, train={"lr": 0.07})
    with pytest.raises(CheckpointError, match=r"another config \(train.lr: 0.05 -> 0.07\)"):
        run_to_folder(other, tmp_path, resume=True)
    # workers and checkpoint_every do not change results: resuming with others is allowed
    run_to_folder(config.model_copy(update={"checkpoint_every": 5}), tmp_path, resume=True)
    assert (tmp_path / "summary.json").is_file()


# --- the command line ---------------------------------------------------------------------------


def test_cli_resumes_from_the_folder_alone_and_refuses_another_config(tmp_path):
    out = tmp_path / "r"
    flags = [*SMOKE, "--rounds", "3", "--checkpoint-every", "1"]
    res = invoke("run", "--algorithm", "fedavg", *flags, "--out", tmp_path / "ref")
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["checkpoint_every"] == 1 and not (tmp_path / "ref" / CHECKPOINT).exists()
    with pytest.raises(Stop):
        run_to_folder(tiny_from(config), out, stop_after(2))

    res = invoke("run", "--resume", "--out", tmp_path / "nothing")
    assert res.exit_code == 2 and "no checkpoint" in res.output, res.output
    res = invoke("run", "--algorithm", "fedavg", *flags, "--lr", "0.07", "--out", out)
    assert res.exit_code == 2 and "train.lr: 0.05 -> 0.07" in res.output and "--overwrite" in res.output, res.output
    res = invoke("run", "--resume", "--out", out)  # the config comes from the folder
    assert res.exit_code == 0, res.output
    assert "resuming" in res.output and "round 2" in res.output
    assert folder(out) == folder(tmp_path / "ref")


def tiny_from(config: dict):
    from fedtail.config import RunConfig

    return RunConfig.model_validate(config)


def test_default_checkpoint_every_leaves_config_json_as_it_was():
    assert "checkpoint_every" not in tiny_config().model_dump(mode="json")
    assert tiny_config(checkpoint_every=0).model_dump(mode="json")["checkpoint_every"] == 0


# --- sweeps: a checkpointed folder is partial and resumes ----------------------------------------

SWEEP = 'out = "{out}"\nseeds = [0]\n' + sweep_base(4, extra="checkpoint_every = 2") + "[methods.fedavg]\n"


def test_a_sweep_resumes_a_checkpointed_run_and_counts_only_its_remaining_rounds(tmp_path):
    from fedtail.sweep import load_sweep, run_status
    from fedtail.sweep.estimate import WallTimes, estimate

    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(out=(tmp_path / "runs").as_posix()))
    (fedavg,) = load_sweep(path).runs
    reference = run_to_folder(fedavg.config, tmp_path / "ref")
    with pytest.raises(Stop):
        run_to_folder(fedavg.config, fedavg.dir, stop_after(3))
    status = run_status(fedavg)
    assert (status.state, status.rounds_done) == ("partial", 2)
    times = WallTimes()
    times.add(fedavg, 10.0)
    assert estimate([status], times=times).minutes[fedavg.dir] == pytest.approx(5.0)  # half of its rounds are left

    res = invoke("sweep", path, "--dry-run")
    assert res.exit_code == 0, res.output
    assert "partial" in res.output and "checkpoint after round 2/4; it resumes there" in res.output
    assert "0 done, 0 pending, 0 stale, 0 busy, 1 partial" in res.output
    res = invoke("sweep", path)
    assert res.exit_code == 0, res.output
    assert "1 to run (1 resumed from checkpoints)" in res.output and "1 runs finished" in res.output
    assert "resuming from the checkpoint after round 2/4" in (fedavg.dir / "run.log").read_text()
    assert folder(fedavg.dir) == folder(tmp_path / "ref") and no_timing(reference) == folder(fedavg.dir)[0]
    assert not (fedavg.dir / CHECKPOINT).exists()

    # a checkpoint of another config is not resumed: the folder is cleared and rerun
    other = tmp_path / "other"
    with pytest.raises(Stop):
        run_to_folder(fedavg.config.model_copy(update={"seed": 5}), other, stop_after(3))
    (fedavg.dir / "summary.json").unlink()
    for name in (CHECKPOINT, CHECKPOINT_INFO):
        (other / name).replace(fedavg.dir / name)
    status = run_status(fedavg)
    assert status.state == "pending" and "checkpoint is of another config: seed: 5 -> 0" in status.note
