"""Runs that cannot lie: divergence stops a run, bad replies are rejected, clients may fail."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_config
from fedtail.algorithms.base import Message
from fedtail.algorithms.clustering import flatten
from fedtail.algorithms.ifca import random_init_weights
from fedtail.config import FaultConfig
from fedtail.engine import prepare, replies
from fedtail.engine.callbacks import Callback, Rows
from fedtail.engine.checkpoint import encode
from fedtail.engine.replies import Channel, Delivered, ReplyCheck, RoundSkipped, dropped_clients, nonfinite_at
from fedtail.engine.simulation import Simulation, sample_clients
from fedtail.errors import ConfigError, RunDiverged
from fedtail.runner import run_to_folder
from helpers import PACKAGED, algorithm_config, invoke, run, same, simulation, strip_timing, SMOKE


def round_logs(rows: list[dict]) -> list[dict]:
    return [log for row in rows for log in row["rounds_log"]]


@pytest.fixture
def lose(monkeypatch):
    """``lose({round: {clients}})``: exactly those clients fail in those rounds (not the seeded draw)."""

    def script(lost: dict[int, set[int]]) -> None:
        monkeypatch.setattr(replies, "fails", lambda seed, rnd, cid, p: cid in lost.get(rnd, ()))

    return script


# --- every algorithm --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PACKAGED)
def test_every_algorithm_has_every_reply_accepted_in_a_normal_run(name):
    rows, _ = run(algorithm_config(name, checkpoint_every=0))
    logs = round_logs(rows)
    assert [log["round"] for log in logs] == [1, 2, 3, 4]
    for log in logs:
        assert (log["rejected"], log["dropped"]) == (0, 0), log.get("rejections")
        assert log["sampled"] == len(log["clients"]) <= log["replied"]  # FedGroup and FL+HC may ask more
        assert "skipped" not in log


@pytest.mark.parametrize("name", PACKAGED)
def test_every_algorithm_survives_dropouts_and_a_round_where_every_client_fails(name):
    config = algorithm_config(name, checkpoint_every=0, faults={"dropout": 0.3})
    rows, sim = run(config)
    logs = round_logs(rows)
    for log in logs:
        lost = dropped_clients(config.seed, log["round"], log["clients"], 0.3)
        # they also message clients not sampled (pre-training, clustering; FedRep's final head fine-tuning)
        if name in ("fedgroup", "flhc") or (name == "fedrep" and log["round"] == config.rounds):
            assert log["dropped"] >= len(lost) and log["replied"] + log["dropped"] >= log["sampled"]
        else:
            assert log["dropped"] == len(lost) and log["replied"] == log["sampled"] - len(lost)
            assert ("skipped" in log) == (len(lost) == len(log["clients"]))
    assert sim.record.summary(sim.meter, 0.0, config.rounds)["status"] == "finished"

    # every client fails in every round: nothing changes on the server, no client state appears
    config = algorithm_config(name, checkpoint_every=0, rounds=2, faults={"dropout": 1.0})
    fresh = Simulation(config, *prepare(config))
    rows, sim = run(config)
    assert all(log["replied"] == 0 and "skipped" in log for log in round_logs(rows))
    assert same(encode(sim.server.state_dict()), encode(fresh.server.state_dict()))
    assert sim.client_state == {}
    assert sim.meter.samples_trained == 0


# 6 clients, all sampled every round: who fails. Every round misses someone; round 2 leaves one
# client (MuPFL with 2 round-robin edges: edge 1 gets nothing, edge 0 one reply), round 5 one edge.
LOST = {1: {0, 3}, 2: {0, 1, 2, 3, 5}, 3: {1, 4}, 4: {4}, 5: {0, 1, 2}, 6: {2, 5}}


@pytest.mark.parametrize("name", PACKAGED)
def test_every_algorithm_runs_on_partial_replies_in_every_round(name, lose):
    lose(LOST)
    config = algorithm_config(name, checkpoint_every=0, rounds=6, fraction=1.0)
    rows, sim = run(config)
    logs = round_logs(rows)
    assert [log["round"] for log in logs] == list(range(1, 7))
    # FedGroup has nothing to do before K members of its pre-training set P replied; a round in
    # which every client of P fails ends with that exchange (here round 2)
    grouped = next(i for i, log in enumerate(logs) if "clustering" in log) if name == "fedgroup" else 0
    for i, log in enumerate(logs):
        assert "skipped" not in log or i < grouped
        if name not in ("fedgroup", "flhc"):  # they also message clients beyond the sampled ones
            assert log["replied"] == 6 - len(LOST[log["round"]])
    assert nonfinite_at(rows) is None
    assert nonfinite_at(sim.server.state_dict()) is None and nonfinite_at(sim.edge.state_dict()) is None
    assert len(rows) == 6 and all(0 <= row["personalized_acc"] <= 1 for row in rows)


# --- missing replies, algorithm by algorithm ---------------------------------------------------------


def clustering_records(rows: list[dict]) -> list[dict | None]:
    return [log.get("clustering") for log in round_logs(rows)]


def test_fedgroup_groups_clients_whose_cold_start_failed_once_they_reply(lose):
    config = algorithm_config("fedgroup", checkpoint_every=0, rounds=2, fraction=1.0, log_clustering_every=1)
    pretrained = clustering_records(run(config.model_copy(update={"rounds": 1}))[0])[0]["pretrained"]
    others = sorted(set(range(6)) - set(pretrained))
    lost = {pretrained[0], others[0]}  # one of P (K = 2 of its 3 still reply) and one newcomer
    lose({1: lost})
    rows, sim = run(config)
    first, second = clustering_records(rows)
    assert first["pretrained"] == pretrained[1:] and first["newcomers"] == others[1:]
    assert first["clients"] == sorted(set(range(6)) - lost)
    assert second["newcomers"] == sorted(lost) and second["clients"] == list(range(6))
    assert sorted(sim.server.group_of) == list(range(6))


def test_fedac_clusters_first_once_enough_clients_have_uploaded(lose):
    # K-means of R^0 needs K models: with one upload there would be one cluster for good (CNT
    # cannot split K = 1), so the first clustering waits for min(K, clients a round) uploads
    lose({1: {0, 1, 2, 3, 4}})
    config = tiny_config(algorithm="fedac", rounds=3, fraction=1.0, options={"num_clusters": 2, "cnt": False}, log_clustering_every=1)
    records = clustering_records(run(config)[0])
    assert records[1] is not None and records[1]["num_clusters"] == 2
    assert records[0] is None and sorted(records[1]["clients"]) == list(range(6))


def test_fesem_seeds_its_centres_from_trained_models_once_enough_have_uploaded(lose):
    # with one trained model the other centre would be a random initialisation, nobody's nearest
    lose({1: {0, 1, 2, 3, 4}})
    options = {"num_clusters": 2, "init": "first-round", "cold_start": "loss"}
    config = tiny_config(algorithm="fesem", rounds=2, fraction=1.0, options=options)
    rows, sim = run(config)
    server, ctx = sim.server, sim.server_ctx
    init = flatten(ctx.init_weights, server.keys)
    far = float((flatten(random_init_weights(ctx, 1), server.keys) - init).norm())
    # round 2 still trained the initial model everywhere; the centres are means of those models
    models = torch.stack([server.models[c] for c in range(6)])
    assert float((models - init).norm(dim=1).max()) < 0.2 * far
    assert float((server.centres - init).norm(dim=1).max()) < 0.2 * far
    records = clustering_records(rows)
    assert records[0] is None and records[1]["clients"] == list(range(6)) and records[1]["num_clusters"] == 2


def test_mupfl_edges_reduce_the_replies_that_arrived(lose):
    lose({1: {0, 1, 2, 3, 5}})  # round-robin edges: edge 0 keeps client 4, edge 1 gets nothing
    config = algorithm_config("mupfl", checkpoint_every=0, rounds=2, fraction=1.0, log_clustering_every=1)
    rows, sim = run(config)
    first, second = (log["acmu"] for log in round_logs(rows))
    assert [(r["edge"], r["clients"], r["clusters"], r["kappa"]) for r in first] == [(0, [4], [0], 1)]
    assert [r["clients"] for r in second] == [[0, 2, 4], [1, 3, 5]]
    # after round 1 the global model was client 4's model (a cluster of one: w̃ = w)
    once = run(config.model_copy(update={"rounds": 1}))[1]
    personal = once.client_state[4]["personal"]
    assert all(torch.allclose(once.server.weights[k].double(), personal[k].double(), atol=1e-6) for k in personal)
    assert set(once.client_state) == {4}


def test_fedpac_combines_only_the_heads_that_arrived(lose):
    lose({1: {0, 2, 3, 5}})
    config = tiny_config(algorithm="fedpac", rounds=1, fraction=1.0)
    rows, sim = run(config)
    alpha = round_logs(rows)[0]["fedpac_alpha"]
    assert alpha["clients"] == [1, 4] and len(alpha["weights"]) == 2
    assert all(len(row) == 2 and sum(row) == pytest.approx(1.0, abs=1e-3) for row in alpha["weights"])
    assert set(sim.client_state) == {1, 4}  # the failed clients never trained nor got a head


def test_a_rejected_reply_leaves_the_client_state_as_it_was_serial_as_with_workers():
    """Ditto changes its state in place; the serial executor must not let a rejected call's change stick."""
    config = tiny_config(algorithm="ditto", rounds=3, fraction=1.0, faults={"max_update_norm": 0.2})
    serial, parallel = run(config), run(config.model_copy(update={"workers": 2}))
    assert sum(log["rejected"] for log in round_logs(serial[0])) > 0
    assert strip_timing(serial[0]) == strip_timing(parallel[0])
    assert same(dict(serial[1].client_state), dict(parallel[1].client_state))


def test_with_client_state_on_disk_rejected_replies_leave_the_state_as_in_memory():
    """The first exchange's states wait on disk as pending (a new schema is learnt); a rejected one never lands."""
    config = tiny_config(algorithm="ditto", rounds=3, fraction=1.0, faults={"max_update_norm": 0.2})
    memory = run(config)[0]
    sim = simulation(config.model_copy(update={"client_state": "disk"}))
    parked, dropped = [], []
    store = sim.client_state
    hold, drop = store.hold, store.drop
    store.hold = lambda cid, state, tag=None: (parked.append(cid), hold(cid, state, tag))  # type: ignore[method-assign]
    store.drop = lambda cid: (dropped.append(cid), drop(cid))  # type: ignore[method-assign]
    sim.run()
    assert parked and sum(log["rejected"] for log in round_logs(memory)) > 0
    assert dropped and set(dropped) <= set(parked)  # a rejected reply's pending state is forgotten
    assert strip_timing(sim.record.rows) == strip_timing(memory)


# --- dropouts ---------------------------------------------------------------------------------------


def test_dropouts_are_seeded_the_same_with_workers_and_leave_a_failed_clients_state_alone():
    config = tiny_config(algorithm="ditto", rounds=4, fraction=1.0, faults={"dropout": 0.4})
    serial, parallel = run(config), run(config.model_copy(update={"workers": 2}))
    assert strip_timing(serial[0]) == strip_timing(parallel[0])
    logs = round_logs(serial[0])
    assert sum(log["dropped"] for log in logs) > 0
    # a client dropped in the last round keeps the state of its previous round
    last = logs[-1]
    lost = dropped_clients(config.seed, 4, last["clients"], 0.4)
    assert lost and len(lost) < len(last["clients"])
    shorter = run(config.model_copy(update={"rounds": 3}))[1]
    for cid in lost:
        assert same(serial[1].client_state.get(cid, {}), shorter.client_state.get(cid, {}))
    kept = [c for c in last["clients"] if c not in lost]
    assert not same(serial[1].client_state[kept[0]], shorter.client_state.get(kept[0], {}))


def test_dropouts_depend_on_seed_round_and_client_only():
    a = dropped_clients(3, 7, list(range(40)), 0.5)
    assert a == dropped_clients(3, 7, list(range(40)), 0.5)
    assert {c for c in a if c < 20} == dropped_clients(3, 7, list(range(20)), 0.5)
    assert a != dropped_clients(3, 8, list(range(40)), 0.5)
    assert dropped_clients(3, 7, list(range(40)), 0.0) == set()
    assert 10 < len(a) < 30


def test_min_replies_skips_a_round_and_leaves_the_server_state_as_it_was():
    config = tiny_config(rounds=6, fraction=0.5, faults={"dropout": 0.3, "min_replies": 3})
    weights = []
    rows: list = []

    class Weights(Callback):  # the global weights after every round
        def on_round_end(self, sim, rnd, row):
            weights.append(sim.server.global_weights())

    sim = Simulation(config, *prepare(config), callbacks=[Rows(rows), Weights()])
    sim.run()
    logs = round_logs(rows)
    skipped = [log["round"] for log in logs if "skipped" in log]
    ran = [log["round"] for log in logs if "skipped" not in log]
    assert skipped and ran  # this seed has both
    for rnd in skipped:
        before = weights[rnd - 2] if rnd > 1 else sim.server_ctx.init_weights
        assert same(weights[rnd - 1], before)
        assert "fewer than 3" in logs[rnd - 1]["skipped"]
    for rnd in ran:
        assert logs[rnd - 1]["dropped"] == 0


def test_min_replies_above_the_clients_of_a_round_is_refused():
    with pytest.raises(ConfigError, match="min-replies 4 exceeds the 3 clients"):
        tiny_config(faults={"min_replies": 4})


def test_default_faults_leave_config_json_as_it_was_and_flags_set_them(tmp_path):
    assert "faults" not in tiny_config().model_dump(mode="json")
    result = invoke("run", "-a", "fedavg", *SMOKE, "--dropout", "0.5", "--min-replies", "2",
                    "--max-update-norm", "100", "--on-nonfinite", "reject", "--out", tmp_path / "r")  # fmt: skip
    assert result.exit_code == 0, result.output
    faults = json.loads((tmp_path / "r" / "config.json").read_text())["faults"]
    assert faults == {"dropout": 0.5, "min_replies": 2, "max_update_norm": 100.0, "on_nonfinite": "reject"}
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "finished"


# --- validation of replies ------------------------------------------------------------------------


class ScriptedChannel(Channel):
    """The engine's channel over prepared answers (a transport that returns what it is told)."""

    def __init__(self, answers: dict[int, Message], faults: FaultConfig = FaultConfig(), model=None, check=None):
        model = model or {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
        self.check_ = check or ReplyCheck(faults, model)
        super().__init__(1, sorted(answers), self.check_, faults, seed=0)
        self.answers = answers
        self.accepted: list[int] = []

    def _deliver(self, messages, call):
        for cid in sorted(messages):
            yield Delivered(cid, self.answers[cid])

    def _accept(self, answer):
        self.accepted.append(answer.cid)


def weights(w=0.0, b=0.0, **extra):
    return {"w": torch.full((2, 3), w), "b": torch.full((3,), b)} | extra


def good(**extra):
    return Message("reply", weights(0.5, **extra), metrics={"num_samples": 4.0, "train_loss": 0.7})


SENT = Message("fit", weights())


@pytest.mark.parametrize(
    "bad, reason",
    [
        (Message("reply", {"w": torch.zeros(2, 3)}, metrics={"num_samples": 4.0}), "missing ['b']"),
        (good(extra=torch.zeros(1)), "extra ['extra']"),
        (Message("reply", {"w": torch.zeros(3, 2), "b": torch.zeros(3)}), "w: shape [3, 2]"),
        (Message("reply", {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(3)}), "torch.float64"),
        (Message("reply", weights(float("nan"))), "non-finite tensor w"),
        (Message("reply", weights(), metrics={"num_samples": 4.0, "train_loss": float("inf")}), "non-finite train_loss"),
    ],
)
def test_a_bad_reply_is_rejected_with_its_reason_and_never_reaches_the_server(bad, reason):
    answers = {0: good(), 1: bad, 2: good(), 3: good()}
    comm = ScriptedChannel(answers, FaultConfig(on_nonfinite="reject"))
    got = comm.exchange({cid: SENT for cid in answers})
    assert sorted(got) == [0, 2, 3] and comm.accepted == [0, 2, 3]
    assert comm.round.log()["rejected"] == 1
    assert comm.round.rejected[0].startswith("client 1: ") and reason in comm.round.rejected[0]
    assert comm.train_loss == pytest.approx(0.7)
    # a later exchange of the same signature, one client at a time, still knows the schema
    comm = ScriptedChannel({1: bad}, FaultConfig(on_nonfinite="reject"), check=comm.check_)
    with pytest.raises(RoundSkipped):
        list(comm.stream({1: SENT}))


def test_a_non_finite_reply_stops_the_run_by_default():
    answers = {0: good(), 1: Message("reply", weights(b=float("-inf")))}
    with pytest.raises(RunDiverged, match="round 1: client 1: non-finite tensor b"):
        ScriptedChannel(answers).exchange({0: SENT, 1: SENT})


def test_names_and_dtypes_of_other_payloads_follow_the_majority_of_the_first_exchange():
    protos = lambda n, dtype=torch.float32: Message("reply", {"proto": torch.zeros(n, 4, dtype=dtype)})  # noqa: E731
    # per-class statistics may differ in shape (the classes a client holds); not in dtype
    comm = ScriptedChannel({0: protos(5), 1: protos(2), 2: protos(5, torch.float16), 3: Message("reply", {})})
    assert sorted(comm.exchange({c: Message("collect") for c in range(4)})) == [0, 1]
    assert "client 2: tensor dtypes differ from the other replies: [('proto', 'torch.float16')]" in comm.round.rejected
    assert "client 3: tensor names differ: missing ['proto'], extra []" in comm.round.rejected


def test_the_update_norm_bound_rejects_a_reply_far_from_what_was_sent():
    far = Message("reply", weights(10.0, 10.0), metrics={"num_samples": 4.0})
    comm = ScriptedChannel({0: good(), 1: far}, FaultConfig(max_update_norm=5.0))
    assert list(comm.exchange({0: SENT, 1: SENT})) == [0]  # 0.5 x 3 = 1.5 < 5 (9 entries); 10 x 3 = 30 > 5
    assert "update norm 30 > --max-update-norm 5" in comm.round.rejected[0]


def test_a_model_entry_under_a_prefix_keeps_the_models_shape():
    bad = Message("reply", {"delta/w": torch.zeros(3, 3)})
    comm = ScriptedChannel({0: Message("reply", {"delta/w": torch.zeros(2, 3)}), 1: bad})
    assert list(comm.exchange({0: Message("fit"), 1: Message("fit")})) == [0]
    assert "delta/w: shape [3, 3]" in comm.round.rejected[0]


def test_too_few_accepted_replies_skip_the_round():
    comm = ScriptedChannel({0: good(), 1: Message("reply", {})}, FaultConfig(min_replies=2))
    with pytest.raises(RoundSkipped, match="1 replies accepted, fewer than 2"):
        comm.exchange({0: SENT, 1: SENT})


# --- divergence -------------------------------------------------------------------------------------


def test_a_diverging_run_stops_keeps_its_rows_and_says_so(tmp_path):
    config = tiny_config(rounds=6, train={"lr": 1e12})
    with pytest.raises(RunDiverged) as err:
        run_to_folder(config, tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "diverged" and "final" not in summary and "best" not in summary
    assert summary["diverged"] == {"round": err.value.round, "cause": err.value.cause}
    metrics = tmp_path / "r" / "metrics.jsonl"
    rows = metrics.read_text().splitlines() if metrics.exists() else []
    assert len(rows) == err.value.round - 1  # every round before the divergence was evaluated and kept


def test_the_cli_exits_3_with_one_line_for_a_diverged_run(tmp_path):
    result = invoke("run", "-a", "fedavg", *SMOKE, "--lr", "1e12", "--rounds", "6", "--out", tmp_path / "r")
    assert result.exit_code == 3
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: run diverged at round ")
    result = invoke("run", "-a", "fedavg", *SMOKE, "--lr", "1e12", "--rounds", "6", "--out", tmp_path / "r")
    assert result.exit_code == 2 and "diverged" in result.output  # the folder holds a (diverged) result


def test_a_non_finite_server_state_stops_the_run_after_the_rows_before_it(monkeypatch, tmp_path):
    from fedtail.algorithms import fedavg

    original = fedavg.FedAvgServer.run_round

    def poisoned(self, rnd, clients, comm):
        original(self, rnd, clients, comm)
        if rnd == 2:
            next(iter(self.weights.values())).fill_(float("nan"))

    monkeypatch.setattr(fedavg.FedAvgServer, "run_round", poisoned)
    with pytest.raises(RunDiverged, match="round 2: non-finite value in the server's state"):
        run_to_folder(tiny_config(rounds=3), tmp_path / "r")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["last_evaluated_round"] == 1


def test_with_reject_a_non_finite_reply_is_only_rejected():
    config = tiny_config(rounds=2, train={"lr": 1e12}, faults={"on_nonfinite": "reject"})
    rows, sim = run(config)
    logs = round_logs(rows)
    assert all(log["rejected"] == log["replied"] and "skipped" in log for log in logs)
    assert same(sim.server.global_weights(), sim.server_ctx.init_weights)
