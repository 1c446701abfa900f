"""Robust aggregation, hostile clients and client-level DP (fedtail.algorithms.aggregate, fedtail.engine.guard)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_config
from fedtail.algorithms import ALGORITHMS
from fedtail.algorithms.aggregate import Noise, Rule, WeightedMean, aggregation, weighted_mean
from fedtail.algorithms.base import Message
from fedtail.engine import checkpoint, guard, prepare
from fedtail.engine.callbacks import Checkpointer
from fedtail.engine.simulation import Simulation
from fedtail.errors import ConfigError, FedtailError
from fedtail.flower.inprocess import InProcessGrid
from fedtail.flower.server import serve
import helpers
from grids import DyingGrid
from helpers import PACKAGED, invoke, run, run_with_summary, same, staged, strip_timing

dp_accounting = pytest.importorskip("dp_accounting")  # `make test` installs the [dp] extra; CI runs these


def mean_of(rule: Rule, values: list[list[float]], weights: list[float] | None = None, noise: Noise | None = None):
    with aggregation(rule, noise):
        acc = WeightedMean()
    for v, w in zip(values, weights or [1.0] * len(values)):
        acc.add({"w": torch.tensor(v, dtype=torch.float32), "n": torch.tensor(len(v), dtype=torch.int64)}, w)
    return acc.result()


# --- the rules ------------------------------------------------------------------------------------


def test_rules_parse_and_say_how_many_inputs_they_need():
    assert [str(Rule.parse(s)) for s in ("mean", "MEDIAN", "trimmed:2", "krum:1", "krum:1:3")] == [
        "mean", "median", "trimmed:2", "krum:1", "krum:1:3"]  # fmt: skip
    assert [Rule.parse(s).min_inputs for s in ("median", "trimmed:2", "krum:1", "krum:2:9")] == [1, 5, 5, 9]
    for bad in ("avg", "trimmed", "trimmed:0", "trimmed:1:2", "krum:1:0", "krum:-1"):
        with pytest.raises(ValueError, match="--aggregate"):
            Rule.parse(bad)


def test_median_and_trimmed_mean_per_coordinate_against_hand_computed_values():
    values = [[1.0, 10.0], [2.0, -5.0], [9.0, 0.0], [100.0, 1.0]]
    # even count: the mean of the two middle values; unweighted whatever the weights
    assert mean_of(Rule("median"), values, [1, 2, 3, 40])["w"].tolist() == pytest.approx([5.5, 0.5])
    assert mean_of(Rule("median"), values[:3])["w"].tolist() == pytest.approx([2.0, 0.0])
    # trimmed:1 drops the largest and the smallest of each coordinate
    assert mean_of(Rule("trimmed", 1), values)["w"].tolist() == pytest.approx([5.5, 0.5])
    five = values + [[3.0, 2.0]]
    assert mean_of(Rule("trimmed", 1), five)["w"].tolist() == pytest.approx([(2 + 3 + 9) / 3, (0 + 1 + 2) / 3])
    assert mean_of(Rule("median"), values)["n"].dtype == torch.int64  # integer tensors come back as integers


def test_krum_takes_the_input_nearest_its_neighbours_and_multi_krum_their_unweighted_mean():
    honest = [[1.0, 1.0], [1.1, 0.9], [0.9, 1.2], [1.0, 0.75], [1.2, 1.0]]  # no tied scores
    values = honest + [[50.0, -50.0], [40.0, 40.0]]
    one = mean_of(Rule("krum", 2), values)["w"]
    assert one.tolist() in [pytest.approx(h) for h in honest]
    # by hand: scores over the n - f - 2 = 3 nearest others
    pts = torch.tensor(values, dtype=torch.float32).double()
    d = torch.cdist(pts, pts).square().sort(dim=1).values[:, 1:4].sum(dim=1)
    assert one.tolist() == pytest.approx(values[int(d.argmin())])
    weights = [1, 2, 3, 4, 5, 100, 100]
    three = mean_of(Rule("krum", 2, 3), values, weights)["w"]
    chosen = d.argsort()[:3].tolist()
    expect = sum(torch.tensor(values[i]) for i in chosen) / 3  # the weights (reported counts) do not count
    assert three.tolist() == pytest.approx(expect.tolist())
    assert mean_of(Rule("krum", 2, 3), values)["w"].tolist() == pytest.approx(three.tolist())
    assert max(chosen) < len(honest)  # the hostile inputs are never chosen


def test_a_rule_with_too_few_inputs_fails_with_the_rule_named():
    with pytest.raises(ValueError, match="trimmed:2 needs at least 5"):
        mean_of(Rule("trimmed", 2), [[1.0], [2.0], [3.0]])


def test_outside_a_round_and_plain_means_stay_the_streaming_weighted_mean():
    values, weights = [[1.0, 2.0], [3.0, 4.0], [100.0, 0.0]], [1.0, 1.0, 2.0]
    expect = [(1 + 3 + 200) / 4, (2 + 4 + 0) / 4]
    assert mean_of(Rule(), values, weights)["w"].tolist() == pytest.approx(expect)
    with aggregation(Rule("median")):
        plain = WeightedMean(plain=True)
        for v, w in zip(values, weights):
            plain.add({"w": torch.tensor(v)}, w)
        server_side = weighted_mean(({"w": torch.tensor(v)}, w) for v, w in zip(values, weights))
    assert plain.result()["w"].tolist() == pytest.approx(expect)
    assert server_side["w"].tolist() == pytest.approx(expect)


# --- hostile clients ------------------------------------------------------------------------------


def test_hostile_clients_are_drawn_from_the_seed_and_corrupt_only_their_updates():
    config = tiny_config(faults={"byzantine": 2, "byzantine_mode": "scale:-3"})
    bad = guard.hostile(config)
    assert len(bad) == 2 and bad == guard.hostile(config) and bad != guard.hostile(config.model_copy(update={"seed": 5}))
    assert guard.hostile(tiny_config()) == frozenset()
    sent = Message("fit", {"w": torch.tensor([1.0, 1.0]), "k": torch.tensor(7)})
    reply = Message("fit", {"w": torch.tensor([2.0, 0.0]), "k": torch.tensor(7), "extra": torch.tensor([1.0])}, metrics={"n": 3.0})
    g = guard.ClientGuard.of(config)
    honest = min(set(range(6)) - bad)
    assert guard.outgoing(config, honest, 1, sent, reply, g) is reply
    out = guard.outgoing(config, min(bad), 1, sent, reply, g)
    assert out.tensors["w"].tolist() == pytest.approx([1 - 3, 1 + 3])  # sent + S * update
    assert out.tensors["extra"].tolist() == pytest.approx([-3.0])  # a tensor not sent: an update of zeros
    assert int(out.tensors["k"]) == 7 and out.metrics == reply.metrics
    flip = guard.ClientGuard.of(tiny_config(faults={"byzantine": 2}))
    assert guard.outgoing(config, min(bad), 1, sent, reply, flip).tensors["w"].tolist() == pytest.approx([0.0, 2.0])
    noisy = guard.ClientGuard.of(tiny_config(faults={"byzantine": 2, "byzantine_mode": "gaussian:2"}))
    a, b = (guard.outgoing(config, min(bad), seed, sent, reply, noisy).tensors["w"] for seed in (1, 1))
    assert torch.equal(a, b) and not torch.equal(a, guard.outgoing(config, min(bad), 2, sent, reply, noisy).tensors["w"])


def test_robust_rules_withstand_hostile_clients_that_break_the_mean():
    base = dict(partition={"num_clients": 10, "alpha": 100.0}, fraction=1.0, rounds=4, checkpoint_every=0)

    def final(**faults) -> float:
        return run(tiny_config(**base, faults=faults))[0][-1]["global_acc"]

    clean, attacked = final(), dict(byzantine=3, byzantine_mode="scale:-20")
    broken = final(**attacked)
    assert broken < clean - 0.3  # 3 of 10 clients sending -20 times their update break the plain mean
    for rule in ("median", "trimmed:3", "krum:3"):
        assert final(aggregate=rule, **attacked) > broken + 0.3, rule


def test_per_class_statistics_take_the_rule_class_by_class_over_their_holders():
    from fedtail.algorithms.federated_features import ClassGradientMean
    from fedtail.algorithms.prototypes import ClassMean

    # 5 clients, 3 classes of 2 features; class 0 held by all (client 4 hostile), class 1 by two only,
    # class 2 by three; trimmed:1 needs 3 holders
    means = torch.tensor([[[1.0, 2.0], [5.0, 5.0], [1.0, 1.0]],
                          [[2.0, 2.0], [7.0, 7.0], [2.0, 4.0]],
                          [[3.0, 2.0], [0.0, 0.0], [3.0, 9.0]],
                          [[4.0, 2.0], [0.0, 0.0], [0.0, 0.0]],
                          [[900.0, -900.0], [0.0, 0.0], [0.0, 0.0]]])  # fmt: skip
    counts = torch.tensor([[3, 2, 1], [1, 4, 2], [2, 0, 5], [6, 0, 0], [1, 0, 0]])
    with aggregation(Rule("trimmed", 1)):
        protos, grads = ClassMean("weighted"), ClassGradientMean()
    for m, c in zip(means, counts):
        protos.add(m, c)
        grads.add({"weight": m, "bias": m[:, 0]}, c > 0)
    got, present = protos.result()
    assert present.tolist() == [True, False, True]  # class 1: two holders cannot outvote one hostile
    assert got[0].tolist() == pytest.approx([3.0, 2.0])  # 900 and 1 dropped (per coordinate), unweighted
    assert got[2].tolist() == pytest.approx([2.0, 4.0]) and got[1].tolist() == [0.0, 0.0]
    g, held = grads.result()
    assert held.tolist() == [True, False, True] and g["weight"].flatten().tolist() == pytest.approx(got.flatten().tolist())
    assert g["bias"].tolist() == pytest.approx([3.0, 0.0, 2.0]) and g["weight"].dtype == torch.float32
    with aggregation(Rule("trimmed", 1)):
        plain = ClassMean("uniform", plain=True)
    for m, c in zip(means, counts):
        plain.add(m, c)
    assert plain.result()[0][0].tolist() == pytest.approx([182.0, -178.4])  # the plain mean, broken


def test_gldp_and_creff_resist_hostile_prototypes_and_gradients_under_a_robust_rule(monkeypatch):
    from fedtail.algorithms import federated_features

    seen: list[float] = []  # the largest class gradient each round's server mean gives CReFF
    result = federated_features.ClassGradientMean.result

    def recorded(self):
        out = result(self)
        seen.append(max(float(v.abs().max()) for v in out[0].values()))
        return out

    monkeypatch.setattr(federated_features.ClassGradientMean, "result", recorded)
    largest = {}
    for name in ("gldp", "creff"):
        for rule in ("mean", "median"):
            seen.clear()
            base = dict(algorithm=name, partition={"num_clients": 8, "alpha": 100.0}, fraction=1.0, rounds=2, checkpoint_every=0)
            rows, sim = run(tiny_config(**base, faults={"byzantine": 2, "byzantine_mode": "scale:-1000", "aggregate": rule}))
            assert all(math.isfinite(r["personalized_acc"]) for r in rows), (name, rule)
            largest[name, rule] = float(sim.server.protos.abs().max()) if name == "gldp" else max(seen)
    for name in ("gldp", "creff"):  # the plain mean takes the hostile uploads (x -1000), the median leaves them out
        assert largest[name, "median"] * 100 < largest[name, "mean"], (name, largest)
    with pytest.raises(ConfigError, match="fedic cannot take a robust rule: its server distils"):
        guard.check(tiny_config(algorithm="fedic", faults={"aggregate": "median"}), ALGORITHMS["fedic"])


def test_a_flower_node_checks_no_accountant_the_server_does(monkeypatch):
    from fedtail.engine import prepare

    def missing():
        raise ConfigError("--dp-clip needs Google's dp-accounting")

    monkeypatch.setattr(guard, "_accountant", missing)
    config = tiny_config(privacy={"clip": 1.0, "noise": 1.0})
    with pytest.raises(ConfigError, match="dp-accounting"):
        prepare(config)
    prepare(config, server=False)  # a node only clips


def test_runs_with_hostile_clients_and_dp_are_the_same_with_workers_and_resume_bit_identically():
    config = tiny_config(
        faults={"byzantine": 1, "byzantine_mode": "gaussian:0.5", "aggregate": "mean"},
        privacy={"clip": 0.5, "noise": 0.8}, rounds=4, checkpoint_every=2,
    )
    serial, parallel = run(config)[0], run(config.model_copy(update={"workers": 2}))[0]
    assert strip_timing(serial) == strip_timing(parallel)
    saved: list[bytes] = []
    reference = Simulation(config, *prepare(config), callbacks=[Checkpointer(lambda s: saved.append(checkpoint.to_bytes(s)))])
    reference.run()
    resumed = Simulation(config, *prepare(config))
    resumed.restore(checkpoint.load(saved[0]))
    resumed.run()
    assert strip_timing(resumed.record.rows) == strip_timing(reference.record.rows)
    assert same(checkpoint.encode(resumed.server.state_dict()), checkpoint.encode(reference.server.state_dict()))


SECRET = 0x5EC2E7


class Secret:
    """A simulator's executor holding the DP secret a Flower server drew (``GridExecutor.privacy_secret``)."""

    def __init__(self, executor) -> None:
        self.executor, self.privacy_secret = executor, SECRET

    def __getattr__(self, name):
        return getattr(self.executor, name)


def test_flower_gives_the_simulators_results_with_hostile_clients_a_robust_rule_and_dp(tmp_path, monkeypatch):
    """The same results, DP included once the simulator draws from the Flower server's secret."""
    from fedtail.engine.executors import make_executor
    from fedtail.flower import server

    monkeypatch.setattr(server.secrets, "randbits", lambda bits: SECRET)
    for k, extra in enumerate((
        {"faults": {"byzantine": 2, "byzantine_mode": "sign-flip", "aggregate": "trimmed:1"}},
        {"privacy": {"clip": 0.5, "noise": 1.0}, "faults": {"byzantine": 1}},
    )):
        config = tiny_config(checkpoint_every=0, **extra)
        rows: list[dict] = []
        factory = None if k == 0 else (lambda sim: Secret(make_executor(sim.config, sim.dataset, sim.partition)))
        sim = Simulation(config, *prepare(config), callbacks=[helpers.Rows(rows)], executor_factory=factory)
        summary = sim.run()
        nodes = {100: {"state-dir": str(tmp_path / f"a{k}"), "clients": "0,1,2"}, 101: {"state-dir": str(tmp_path / f"b{k}"), "clients": "3,4,5"}}
        rc = {"config": config.model_dump_json(), "out": str(tmp_path / f"run{k}"), "round-timeout": 0.0, "node-wait": 2.0}
        flower = serve(InProcessGrid(nodes, rc), rc)
        got = [json.loads(line) for line in (tmp_path / f"run{k}" / "metrics.jsonl").read_text().splitlines()]
        assert [r["personalized_acc"] for r in got] == [r["personalized_acc"] for r in rows]
        assert flower["final"] == json.loads(json.dumps(summary["final"]))
        assert flower.get("privacy") == summary.get("privacy") and flower.get("byzantine") == summary.get("byzantine")
    assert flower["privacy"]["randomness"] == guard.SECRET


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps the text of every message the server sends."""

    sent: list[str] = []

    def push_messages(self, messages):
        messages = list(messages)
        RecordingGrid.sent += [repr(m.content) for m in messages]
        return super().push_messages(messages)


def test_a_flower_dp_run_draws_its_clients_and_noise_from_a_secret_no_node_sees(tmp_path, monkeypatch):
    """Under DP the Flower server draws from the operating system's randomness, not from the seed the
    nodes hold; the secret is in its checkpoint only, and a resumed run draws from it again."""
    from fedtail.engine.simulation import sample_clients
    from fedtail.flower import server

    first, second = 987_654_321_123, 123_456_789_987
    drawn = iter([first, first, second])  # an unstopped run, one that dies, its resumption (not second)
    monkeypatch.setattr(server.secrets, "randbits", lambda bits: next(drawn))
    config = tiny_config(rounds=4, checkpoint_every=2, eval_every=2, privacy={"clip": 0.5, "noise": 1.0})
    summary, rows, _ = run_with_summary(config)
    assert summary["privacy"]["randomness"] == guard.FROM_SEED

    def folder(name: str) -> tuple[dict, dict]:
        nodes = {100: {"state-dir": str(tmp_path / name / "a"), "clients": "0,1,2"},
                 101: {"state-dir": str(tmp_path / name / "b"), "clients": "3,4,5"}}  # fmt: skip
        return nodes, {"config": config.model_dump_json(), "out": str(tmp_path / name / "run"), "round-timeout": 0.0, "node-wait": 2.0}

    nodes, rc = folder("whole")
    RecordingGrid.sent = []
    flower = serve(RecordingGrid(nodes, rc), rc)
    assert flower["privacy"]["randomness"] == guard.SECRET
    assert RecordingGrid.sent and not any(str(first) in text for text in RecordingGrid.sent)  # no node is told
    got = [json.loads(line) for line in (tmp_path / "whole" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["personalized_acc"] for r in got] != [r["personalized_acc"] for r in rows]  # not the seed's draws
    logged = [(entry["round"], entry["clients"]) for row in got for entry in row["rounds_log"]]
    assert [c for _, c in logged] == [sample_clients(first, r, 6, 3) for r, _ in logged]  # sampled from the secret
    assert any(c != sample_clients(config.seed, r, 6, 3) for r, c in logged)
    nodes, rc = folder("died")
    with pytest.raises(RuntimeError, match="died"):
        serve(DyingGrid(nodes, rc, run_id=3, die_in=3), rc, run_id=3)
    state = checkpoint.load(tmp_path / "died" / "run" / "checkpoint.pt")
    assert state["round"] == 2 and state["executor"]["privacy_secret"] == first
    resumed = serve(InProcessGrid(nodes, rc | {"resume": True}, run_id=4), rc | {"resume": True}, run_id=4)
    assert resumed["final"] == flower["final"]  # the checkpoint's secret, not the one the new server drew


# --- client-level DP ------------------------------------------------------------------------------


def test_dp_clips_each_update_to_the_clipping_norm_and_leaves_small_ones_alone():
    config = tiny_config(privacy={"clip": 1.0, "noise": 1.0})
    g = guard.ClientGuard.of(config)
    sent = Message("fit", {"a": torch.zeros(3), "b": torch.ones(2), "k": torch.tensor(3)})
    big = Message("fit", {"a": torch.tensor([3.0, 0.0, 0.0]), "b": torch.tensor([1.0, 5.0]), "k": torch.tensor(9)})
    out = guard.outgoing(config, 0, 1, sent, big, g)
    delta = torch.cat([out.tensors["a"], out.tensors["b"] - 1])
    assert float(delta.norm()) == pytest.approx(1.0, rel=1e-6)
    assert (delta / delta.norm()).tolist() == pytest.approx([0.6, 0.0, 0.0, 0.0, 0.8], abs=1e-6)  # direction kept
    assert int(out.tensors["k"]) == 9  # integer buffers are not an update
    small = Message("fit", {"a": torch.tensor([0.3, 0.0, 0.0]), "b": torch.ones(2), "k": torch.tensor(9)})
    assert torch.equal(guard.outgoing(config, 0, 1, sent, small, g).tensors["a"], small.tensors["a"])
    unsent = Message("fit", {"a": torch.zeros(3), "proto": torch.ones(4)})
    with pytest.raises(FedtailError, match="'proto'.*cannot be clipped"):
        guard.outgoing(config, 0, 1, sent, unsent, g)


def test_dp_noise_on_the_sum_has_the_promised_scale_and_the_mean_is_unweighted():
    n, std, size = 5, 2.0, 200_000
    x = torch.full((size,), 3.0)
    with aggregation(Rule(), Noise(std, torch.Generator().manual_seed(0))):
        acc = WeightedMean()
    for k in range(n):
        acc.add({"w": x}, weight=10.0 ** k)  # weights ignored under DP
    err = acc.result()["w"] - 3.0
    assert float(err.mean()) == pytest.approx(0.0, abs=4 * std / n / math.sqrt(size))
    assert float(err.std()) == pytest.approx(std / n, rel=0.01)  # σ on the sum, divided by n


def test_epsilon_matches_the_accountants_own_example():
    # dp-accounting's test_compute_epsilon_delta_gaussian: noise multiplier 4.530877117 gives (1, 1e-6)-DP;
    # every client every round, one round, replace-one (sensitivity 2C): z = 2 × 4.530877117
    config = tiny_config(fraction=1.0, rounds=1, privacy={"clip": 1.0, "noise": 2 * 4.530877117, "delta": 1e-6})
    assert guard.epsilon(config, 1) == pytest.approx(1.0, abs=1e-3)
    # composition: ε grows with rounds, and the accountant composing them itself agrees
    sub = tiny_config(partition={"num_clients": 50}, fraction=0.2, rounds=30, privacy={"clip": 1.0, "noise": 1.5})
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(50, 10, dp_accounting.GaussianDpEvent(0.75)), 30)
    assert guard.epsilon(sub, 30) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert guard.epsilon(sub, 10) < guard.epsilon(sub, 30)


def test_with_nested_stages_the_rounds_of_one_draw_of_clients_compose_under_that_draw():
    config = staged(stage_schedule="nested", rounds_per_stage=None, privacy={"clip": 1.0, "noise": 2.0})
    m_stages, rounds = config.plan.num_stages, config.rounds
    assert config.plan.schedule == "nested" and m_stages > 1 and rounds % m_stages == 0
    n, m = config.partition.num_clients, config.clients_per_round
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    draw = dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), m_stages))
    acc.compose(draw, rounds // m_stages)
    assert guard.epsilon(config, rounds) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    # the same rounds with a fresh draw each would claim less: the M rounds share their clients
    flat = tiny_config(partition={"num_clients": n}, fraction=config.fraction, rounds=rounds, privacy={"clip": 1.0, "noise": 2.0})
    assert flat.clients_per_round == m and guard.epsilon(flat, rounds) < guard.epsilon(config, rounds)
    assert guard.epsilon(config, rounds - 1) < guard.epsilon(config, rounds)  # a partial round of global optimisation


def test_a_hostile_fednova_client_corrupts_its_normalised_update_as_an_update():
    config = tiny_config(algorithm="fednova", faults={"byzantine": 1, "byzantine_mode": "sign-flip"})
    g = guard.ClientGuard.of(config)
    assert g.updates
    sent = Message("fit", {"w": torch.tensor([5.0, 5.0])})
    reply = Message("fit", {"w": torch.tensor([0.5, -0.25])}, metrics={"a_norm": 3.0})
    assert guard.outgoing(config, min(g.hostile), 1, sent, reply, g).tensors["w"].tolist() == pytest.approx([-0.5, 0.25])


def test_dp_epsilon_picks_the_noise_that_spends_it_over_the_run():
    config = tiny_config(partition={"num_clients": 20}, fraction=0.5, rounds=20, privacy={"clip": 1.0, "epsilon": 4.0})
    z = guard.noise_multiplier(config)
    assert 0.97 * 4.0 < guard.epsilon(config, 20) <= 4.0 and z > 1
    summary, rows, _ = run_with_summary(tiny_config(rounds=3, privacy={"clip": 1.0, "epsilon": 8.0}))
    assert summary["privacy"]["epsilon"] == pytest.approx(8.0, rel=0.03) and summary["privacy"]["delta"] == 1e-5
    spent = [r["epsilon"] for r in rows]
    assert len(spent) == 3 and all(a < b for a, b in zip(spent, spent[1:]))  # spent per round, growing
    assert spent[-1] == pytest.approx(summary["privacy"]["epsilon"])
    config = tiny_config(rounds=3, privacy={"clip": 1.0, "epsilon": 8.0})
    assert spent == pytest.approx([guard.epsilon(config, r["round"]) for r in rows])


def test_the_server_noises_each_mean_with_z_times_the_clip_and_the_noise_changes_the_run():
    config = tiny_config(privacy={"clip": 0.25, "noise": 1.6})
    with guard.server_aggregation(config, 1):
        acc = WeightedMean()
        plain = WeightedMean(plain=True)
    assert acc.noise is not None and acc.noise.std == pytest.approx(1.6 * 0.25) and plain.noise is None
    with guard.server_aggregation(tiny_config(), 1):
        assert WeightedMean().noise is None
    noised, _ = run(config)
    clipped, _ = run(tiny_config(privacy={"clip": 0.25, "noise": 0.0}))
    assert [r["personalized_acc"] for r in noised] != [r["personalized_acc"] for r in clipped]


def test_dp_refuses_settings_that_drop_clients_for_what_their_data_did():
    with pytest.raises(ConfigError, match="--on-nonfinite reject"):
        tiny_config(privacy={"clip": 1.0, "noise": 1.0}, faults={"on_nonfinite": "reject"})
    with pytest.raises(ConfigError, match="would reject clipped updates"):
        tiny_config(privacy={"clip": 1.0, "noise": 1.0}, faults={"max_update_norm": 1.0})
    assert tiny_config(privacy={"clip": 1.0, "noise": 1.0}, faults={"max_update_norm": 1.01}).faults.max_update_norm == 1.01


def test_every_algorithm_says_whether_it_takes_the_rules_and_dp_and_a_refusal_is_one_error(tmp_path):
    for name in PACKAGED:
        spec = ALGORITHMS[name]
        assert spec.robust is True or (isinstance(spec.robust, str) and spec.robust), name
    assert {n for n in PACKAGED if ALGORITHMS[n].dp is True} >= {"fedavg", "fedprox", "ditto", "fedrep", "fedper"}
    listing = invoke("list").output
    assert "robust: --aggregate median|trimmed|krum: no: averages per cluster" in listing
    assert "privacy: client-level DP (--dp-clip): yes" in listing
    for args, message in (
        (["-a", "fedac", "--aggregate", "median"], "fedac cannot take a robust rule"),
        (["--aggregate", "krum:2"], "krum:2 needs at least 7 replies a round; the run samples 3"),
        (["--dp-clip", "1", "--dp-noise", "1", "--aggregate", "median"], "takes --aggregate mean"),
        (["--dp-clip", "-1", "--dp-noise", "1"], "--dp-clip: Input should be greater than 0"),
        (["--dp-noise", "1"], "need --dp-clip"),
        (["-a", "gldp", "--dp-clip", "1", "--dp-noise", "1"], "gldp cannot take client-level DP"),
        (["--byzantine-mode", "gaussian:0"], "--byzantine-mode takes"),
    ):
        result = invoke("run", "--dataset", "synthetic", "--model", "mlp", "--clients", "6", "--fraction", "0.5",
                        "--rounds", "1", "--out", tmp_path / "x", *args)  # fmt: skip
        assert result.exit_code != 0 and message in result.output, (args, result.output)
        assert not (tmp_path / "x" / "summary.json").exists()


def test_the_report_shows_the_rule_the_hostile_clients_and_the_epsilon_of_each_run(tmp_path):
    for name, args in (("dp", ["--dp-clip", "0.5", "--dp-noise", "1"]), ("robust", ["-a", "ditto", "--aggregate", "median", "--byzantine", "1"])):
        result = invoke("run", "--dataset", "synthetic", "--model", "mlp", "--clients", "6", "--fraction", "0.5",
                        "--rounds", "2", "--out", tmp_path / "runs" / name, *args)  # fmt: skip
        assert result.exit_code == 0, result.output
    eps = json.loads((tmp_path / "runs" / "dp" / "summary.json").read_text())["privacy"]["epsilon"]
    assert invoke("report", tmp_path / "runs", "--out", tmp_path / "R.md").exit_code == 0
    text = (tmp_path / "R.md").read_text()
    assert "## Robustness and privacy" in text and f"| {eps:.3g} |" in text
    assert "| median | 1 (sign-flip) |" in text
    # the honest clients' column: the final round's per-client accuracies without the hostile client
    robust = tmp_path / "runs" / "robust"
    hostile = json.loads((robust / "summary.json").read_text())["byzantine"]["clients"]
    last = json.loads((robust / "metrics.jsonl").read_text().splitlines()[-1])
    honest = [a for i, a in enumerate(last["per_client_acc"]) if i not in hostile]
    assert len(honest) == len(last["per_client_acc"]) - 1
    row = next(line for line in text.splitlines() if "| median | 1 (sign-flip) |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # two-decimal cells: compared within half a unit of the last place (the two sides round alike
    # except at a .xx5 boundary, where the last bit of a mean can tip them)
    assert cells[9].endswith(" (1 seed)") and float(cells[9].split()[0]) == pytest.approx(100 * sum(honest) / len(honest), abs=0.0051), row
    assert float(cells[8].split()[0]) == pytest.approx(100 * last["personalized_acc"], abs=0.0051), row
    dp_row = next(line for line in text.splitlines() if "| mean | 0 |" in line)
    assert [c.strip() for c in dp_row.strip("|").split("|")][9] == "—"  # no hostile clients: no column of its own
