"""FedReMa: MDS, soft logits, the CCP, Eq. 7 / Eq. 10 head aggregation, heads by client id,
partial participation, real runs whose CCP ends, the FedAvg ablation, a CLI run, serial = parallel."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torch import nn

from conftest import tiny_config
from fedtail.algorithms import fedrema as fedrema_module
from fedtail.algorithms.fedrema import ccp_check, mds, random_feature, soft_logits
from helpers import (
    PartialComm,
    ScriptedComm,
    algorithm_config,
    assert_config_error,
    assert_same,
    assert_serial_and_parallel_agree,
    reply,
    run,
    run_cli,
    simulation,
    strip_timing,
)

# --- MDS (Alg. 1) ------------------------------------------------------------------------------


def test_mds_cuts_at_the_largest_peer_gap_ignoring_the_gap_to_itself():
    # peers sorted: 0.2, 0.3 | 0.85, 0.9 -> the cut is the 0.55 gap
    assert mds([1.0, 0.9, 0.85, 0.3, 0.2], 0) == ([0, 1, 2], pytest.approx(0.55))
    # the gap from the best peer (0.5) to itself (1.0) is the largest, but is not a candidate
    assert mds([1.0, 0.5, 0.45, 0.1], 0) == ([0, 1, 2], pytest.approx(0.35))
    # the client need not come first; its own entry is never a peer
    assert mds([0.1, 0.8, 1.0, 0.2, 0.75], 2) == ([1, 2, 4], pytest.approx(0.55))
    # a single relevant peer, and none above the cut but the client's best match
    assert mds([0.9, 0.1, 0.15, 1.0], 3) == ([0, 3], pytest.approx(0.75))


def test_mds_ties_are_never_split_and_equal_largest_gaps_take_the_lowest_cut():
    # all peers equally similar: no gap, everyone is relevant
    assert mds([1.0, 0.5, 0.5, 0.5], 0) == ([0, 1, 2, 3], pytest.approx(0.0, abs=1e-12))
    # two equal largest gaps (0.25): the lower cut, the larger set
    assert mds([1.0, 0.25, 0.5, 0.75], 0) == ([0, 2, 3], pytest.approx(0.25))
    assert mds([0.75, 0.5, 1.0, 0.25], 2) == ([0, 1, 2], pytest.approx(0.25))
    # equal similarities at the cut stay together
    assert mds([1.0, 0.8, 0.1, 0.8], 0) == ([0, 1, 3], pytest.approx(0.7))
    assert mds([1.0, 0.25, 0.5, 0.5, 0.75], 0) == ([0, 2, 3, 4], pytest.approx(0.25))


def test_mds_treats_similarities_equal_up_to_rounding_as_ties():
    # float64 cosines of identical heads differ by ~1e-16 from machine to machine: no cut there
    ulp = 2.0**-53
    assert mds([1.0, 1.0 - ulp, 1.0, 1.0 - 2 * ulp, 1.0], 0) == ([0, 1, 2, 3, 4], pytest.approx(0.0, abs=1e-12))
    # two largest gaps equal up to rounding: still the lower cut, the larger set
    assert mds([1.0, 0.25, 0.5, 0.75 + 4 * ulp], 0) == ([0, 2, 3], pytest.approx(0.25))
    assert mds([1.0, 0.25 - 2 * ulp, 0.5, 0.75], 0) == ([0, 2, 3], pytest.approx(0.25))
    # a real gap still cuts, and neighbours of the cut within rounding stay on their side
    assert mds([1.0, 0.9, 0.9 - ulp, 0.3, 0.3 + ulp], 0) == ([0, 1, 2], pytest.approx(0.6))


def test_mds_with_two_clients_or_one():
    assert mds([1.0, 0.3], 0) == ([0, 1], pytest.approx(0.0, abs=1e-12))  # one peer: no gap to compare, both relevant
    assert mds([0.3, 1.0], 1) == ([0, 1], pytest.approx(0.0, abs=1e-12))
    assert mds([1.0], 0) == ([0], pytest.approx(0.0, abs=1e-12))


# --- soft logits -------------------------------------------------------------------------------


def test_soft_logits_of_hand_made_heads():
    linear = nn.Linear(3, 2)
    r = torch.tensor([0.5, 0.25, 1.0])
    heads = [
        {"weight": torch.tensor([[1.0, 0, 0], [0, 1, 0]]), "bias": torch.zeros(2)},  # logits (0.5, 0.25)
        {"weight": torch.zeros(2, 3), "bias": torch.tensor([0.0, 1.0])},  # logits (0, 1)
    ]
    before = {k: v.clone() for k, v in linear.state_dict().items()}
    p = soft_logits(linear, heads, r, temperature=0.5, prefix="")

    def softmax(a, b):
        return [math.exp(a) / (math.exp(a) + math.exp(b)), math.exp(b) / (math.exp(a) + math.exp(b))]

    # divided by M = 0.5 for both clients: (1, 0.5) and (0, 2)
    assert p.flatten().tolist() == pytest.approx(softmax(1.0, 0.5) + softmax(0.0, 2.0))
    assert p.shape == (2, 2) and linear.training
    assert_same(linear.state_dict(), before)  # the module's own weights are never touched
    p = soft_logits(linear, heads, r, temperature=1.0, prefix="")
    assert p.flatten().tolist() == pytest.approx(softmax(0.5, 0.25) + softmax(0.0, 1.0))

    # a two-layer head (cnn2fc's FC-ReLU-FC), keys under "head."
    deep = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    head = {
        "head.0.weight": torch.eye(2), "head.0.bias": torch.tensor([-1.0, 0.0]),
        "head.2.weight": torch.tensor([[1.0, 1.0], [0.0, 2.0]]), "head.2.bias": torch.zeros(2),
    }  # fmt: skip
    # (0.5, 0.25) -> (-0.5, 0.25) -> ReLU (0, 0.25) -> (0.25, 0.5) -> /0.5 -> (0.5, 1)
    p = soft_logits(deep, [head], torch.tensor([0.5, 0.25]), temperature=0.5)
    assert p.flatten().tolist() == pytest.approx(softmax(0.5, 1.0))


def test_random_feature_is_seeded_and_uniform():
    r = random_feature(7, 1000)
    assert r.shape == (1000,) and r.min() >= 0 and r.max() < 1 and abs(r.mean().item() - 0.5) < 0.05
    assert torch.equal(r, random_feature(7, 1000))
    assert not torch.equal(r, random_feature(8, 1000))


# --- the CCP (Eq. 8-9) -------------------------------------------------------------------------


def test_ccp_check_ends_at_the_first_ratio_below_delta():
    gaps = [0.2, 0.4, 0.3, 0.21, 0.19, 0.5]
    max_gap, ratios, goes_on = 0.0, [], []
    for g in gaps:
        on, max_gap, ratio = ccp_check(g, max_gap, delta=0.5)
        ratios.append(ratio)
        goes_on.append(on)
    assert ratios == pytest.approx([1.0, 1.0, 0.75, 0.525, 0.475, 1.0])  # the max includes this round
    assert goes_on == [True, True, True, True, False, True]
    assert ccp_check(0.0, 0.0, 0.5) == (True, 0.0, pytest.approx(1.0))  # nothing has dropped yet
    assert ccp_check(0.25, 0.5, 0.5)[0]  # ratio exactly δ: the CCP goes on
    assert not ccp_check(0.0, 0.5, 0.5)[0]


# --- the server, with hand-made heads ----------------------------------------------------------

SIZES = [10, 20, 30, 40, 50, 60]


def server(**options):
    sim = simulation(tiny_config(algorithm="fedrema", options=options))
    return sim.server, sim.server_ctx.init_weights


def head_of(bias: list[float]) -> dict:
    """A head whose logits are ``bias`` for every input (zero weight)."""
    return {"head.weight": torch.zeros(5, 64), "head.bias": torch.tensor(bias)}


def grouped(k: int, strength: float = 4.0) -> list[float]:
    """Clients 0-2 lean to class 0, clients 3-5 to class 1; a little per-client variation."""
    bias = [0.0] * 5
    bias[0 if k < 3 else 1] = strength
    bias[2] = 0.1 * k
    return bias


def scripted(init: dict, clients, heads: dict[int, list[float]]) -> ScriptedComm:
    body = {k: v for k, v in init.items() if k.startswith("body.")}
    return ScriptedComm(
        {cid: reply({k: v + cid for k, v in body.items()} | head_of(heads[cid]), SIZES[cid]) for cid in clients}
    )


def run_round(srv, init, rnd, clients, heads):
    comm = scripted(init, clients, heads)
    srv.run_round(rnd, list(clients), comm)
    return comm


def bias_mean(members, heads, weights=None):
    weights = weights or [1.0] * len(members)
    total = sum(weights)
    return sum(torch.tensor(heads[j]).double() * w for j, w in zip(members, weights)) / total


def test_the_server_draws_one_feature_of_the_heads_input_size_per_round(monkeypatch):
    drawn = []

    def recording(seed, dim):
        drawn.append((seed, dim))
        return random_feature(seed, dim)

    monkeypatch.setattr(fedrema_module, "random_feature", recording)
    heads = {k: grouped(k) for k in range(6)}
    seeds = {}
    for run_seed in (0, 1):
        sim = simulation(tiny_config(algorithm="fedrema", seed=run_seed))
        drawn.clear()
        for rnd in (1, 2):
            run_round(sim.server, sim.server_ctx.init_weights, rnd, range(6), heads)
        assert [dim for _, dim in drawn] == [64, 64]  # the mlp head's input size, once a round
        seeds[run_seed] = [seed for seed, _ in drawn]
    assert len(set(seeds[0])) == 2 and not set(seeds[0]) & set(seeds[1])


def test_mds_rounds_average_the_relevant_heads_uniform_or_by_samples_and_count_G():
    heads = {k: grouped(k) for k in range(6)}
    for weighting in ("uniform", "samples"):
        srv, init = server(head_weighting=weighting)
        comm = run_round(srv, init, 1, range(6), heads)
        log = comm.logged["fedrema"]
        assert log["sets"] == [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3 and log["set_sizes"] == [3] * 6
        assert log["ccp"] and not log["ended"] and log["ratio"] == pytest.approx(1.0) and log["ccp_rounds"] == 1
        assert log["mean_gap"] == log["max_gap"] > 0.5
        for k in range(6):
            group = [0, 1, 2] if k < 3 else [3, 4, 5]
            weights = [float(SIZES[j]) for j in group] if weighting == "samples" else None
            expected = bias_mean(group, heads, weights).float()
            assert torch.allclose(srv.heads[k]["head.bias"], expected, atol=1e-6)
        # uniform and n-weighted means differ here (the sizes differ), so the option is not a no-op
        uniform, by_samples = bias_mean([0, 1, 2], heads), bias_mean([0, 1, 2], heads, [10.0, 20, 30])
        assert not torch.allclose(uniform.float(), by_samples.float())
        expected_G = torch.zeros(6, 6, dtype=torch.int64)
        expected_G[:3, :3] = expected_G[3:, 3:] = 1
        assert torch.equal(srv.G, expected_G)
        # the body is FedAvg's; the global head is the n-weighted mean of all uploads
        shift = sum(k * n for k, n in enumerate(SIZES)) / sum(SIZES)  # client k uploaded init body + k
        assert torch.allclose(srv.body["body.1.bias"], init["body.1.bias"] + shift)
        assert torch.allclose(srv.global_head["head.bias"], bias_mean(range(6), heads, SIZES).float(), atol=1e-6)
        # each client is sent (and evaluated with) the body and its own head
        body = {k: v for k, v in srv.body.items()}
        for k in range(6):
            assert_same(srv.evaluation_message(k).tensors, body | srv.heads[k])


def test_ccp_ends_at_the_first_drop_below_delta_never_restarts_and_heads_then_follow_G():
    srv, init = server()
    clustered = {k: grouped(k) for k in range(6)}
    same = {k: grouped(0) for k in range(6)}  # identical heads: all similarities equal, Δs = 0
    run_round(srv, init, 1, range(6), clustered)
    assert srv.in_ccp
    comm = run_round(srv, init, 2, range(6), same)
    log = comm.logged["fedrema"]
    assert log["ccp"] and log["ended"] and log["ratio"] == pytest.approx(0.0, abs=1e-12) and log["ccp_rounds"] == 2
    assert log["sets"] == [list(range(6))] * 6  # the ending round still aggregates by MDS
    assert not srv.in_ccp
    G = srv.G.clone()
    assert torch.equal(torch.diag(G), torch.full((6,), 2)) and G[0, 3] == 1 and G[0, 1] == 2

    later = {k: grouped(5 - k, strength=3.0 + k) for k in range(6)}  # clear groups again: no restart
    for rnd in (3, 4):
        comm = run_round(srv, init, rnd, range(6), later)
        assert comm.logged["fedrema"] == {"ccp": False, "ccp_rounds": 2}
        assert torch.equal(srv.G, G)  # G only counts during the CCP
        for k in range(6):
            expected = bias_mean(range(6), later, [float(g) for g in G[k]]).float()
            assert torch.allclose(srv.heads[k]["head.bias"], expected, atol=1e-6)


def test_rounding_noise_in_the_similarities_neither_splits_sets_nor_moves_the_ccp(monkeypatch):
    # Regression: on another machine the cosines of identical heads came out 1 ± 1e-16, the
    # ratio 1.1e-16 instead of 0. Noise of a few ulps must change no set, gap or CCP decision.
    real = fedrema_module.cosine_matrix
    g = torch.Generator().manual_seed(0)

    def noisy(a, b):
        S = real(a, b)
        return S + 3e-16 * torch.randn(S.shape, generator=g, dtype=S.dtype)

    monkeypatch.setattr(fedrema_module, "cosine_matrix", noisy)
    srv, init = server()
    comm = run_round(srv, init, 1, range(6), {k: grouped(k) for k in range(6)})
    assert comm.logged["fedrema"]["sets"] == [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3
    comm = run_round(srv, init, 2, range(6), {k: grouped(0) for k in range(6)})  # identical heads
    log = comm.logged["fedrema"]
    assert log["sets"] == [list(range(6))] * 6 and log["set_sizes"] == [6] * 6
    assert log["mean_gap"] == 0.0 and log["ended"]  # exactly 0: noise-level gaps are no gaps
    # while every round's gaps are noise, the historical max stays 0 and the CCP goes on
    srv, init = server()
    for rnd in (1, 2, 3):
        comm = run_round(srv, init, rnd, range(6), {k: grouped(0) for k in range(6)})
        log = comm.logged["fedrema"]
        assert log["max_gap"] == 0.0 and log["ratio"] == pytest.approx(1.0) and not log["ended"]
    assert srv.in_ccp


def test_ccp_ratio_equal_to_delta_up_to_rounding_goes_on():
    assert ccp_check(0.1 + 0.2, 0.6, 0.5)[0]  # 0.30000000000000004 / 0.6: δ up to rounding
    assert ccp_check(0.3 - 1e-15, 0.6, 0.5)[0]
    assert not ccp_check(0.29, 0.6, 0.5)[0]


def test_after_the_ccp_heads_use_the_latest_uploads_of_peers_not_sampled_now():
    srv, init = server()
    first = {k: grouped(k) for k in range(6)}
    run_round(srv, init, 1, range(6), first)
    srv.in_ccp = False  # as if the CCP had ended
    srv.G = torch.zeros(6, 6, dtype=torch.int64)
    srv.G[1, [0, 1, 4]] = torch.tensor([3, 1, 2])
    before = {k: dict(h) for k, h in srv.heads.items()}
    now = {k: grouped(k, strength=9.0) for k in range(6)}
    run_round(srv, init, 2, [1, 3], now)
    # client 1: its own new upload and the round-1 uploads of 0 and 4, weighted 3 : 1 : 2
    expected = (3 * torch.tensor(first[0]) + torch.tensor(now[1]) + 2 * torch.tensor(first[4])) / 6
    assert torch.allclose(srv.heads[1]["head.bias"], expected, atol=1e-6)
    # client 3 has an empty row of G (it never took part in the CCP): its own upload
    assert torch.equal(srv.heads[3]["head.bias"], torch.tensor(now[3]))
    for k in (0, 2, 4, 5):  # not sampled: unchanged
        assert_same(srv.heads[k], before[k])


def test_partial_participation_ranks_only_uploaders_and_leaves_the_others_alone():
    srv, init = server()
    heads = {k: grouped(k) for k in range(6)}
    comm = run_round(srv, init, 1, [0, 1, 3, 4], heads)
    log = comm.logged["fedrema"]
    assert log["clients"] == [0, 1, 3, 4] and log["sets"] == [[0, 1], [0, 1], [3, 4], [3, 4]]
    assert set(srv.heads) == {0, 1, 3, 4}
    init_head = {k: v for k, v in init.items() if k.startswith("head.")}
    for k in (2, 5):  # never uploaded: the common initial head, in training and evaluation
        assert_same(srv.head_of(k), init_head)
        assert_same({k2: v for k2, v in srv.evaluation_message(k).tensors.items() if k2.startswith("head.")}, init_head)
    assert srv.G[2].sum() == 0 and srv.G[:, 5].sum() == 0
    kept = {k: dict(srv.heads[k]) for k in (0, 3)}
    comm = run_round(srv, init, 2, [1, 2, 4, 5], heads)
    assert comm.logged["fedrema"]["sets"] == [[1, 2], [1, 2], [4, 5], [4, 5]]
    for k in (0, 3):
        assert_same(srv.heads[k], kept[k])


@pytest.mark.parametrize("uploads", [[0, 4], [3]])
def test_a_round_with_fewer_than_three_uploads_never_ends_the_ccp(uploads):
    # With fewer than two peers no client has a gap (Δs_k = 0): a round whose other clients did not
    # reply says nothing about Δs̄, and must not end the CCP by a ratio of 0.
    srv, init = server()
    heads = {k: grouped(k) for k in range(6)}
    run_round(srv, init, 1, range(6), heads)
    max_gap = srv.max_gap
    assert max_gap > 0.5
    comm = PartialComm(scripted(init, uploads, heads).replies)  # the other clients are sent a head, never answer
    srv.run_round(2, list(range(6)), comm)
    log = comm.logged["fedrema"]
    assert log["ccp"] and not log["ended"] and log["ratio"] is None and log["clients"] == uploads
    assert srv.in_ccp and srv.max_gap == max_gap and srv.ccp_rounds == 2
    assert log["sets"] == [uploads] * len(uploads)  # still MDS: each uploader with the others present
    assert run_round(srv, init, 3, range(6), heads).logged["fedrema"]["ccp"]


def test_fit_messages_carry_each_clients_own_head():
    srv, init = server()
    heads = {k: grouped(k) for k in range(6)}
    run_round(srv, init, 1, [0, 1, 3, 4], heads)
    expected = {k: srv.body | srv.head_of(k) for k in range(6)}
    comm = run_round(srv, init, 2, [1, 2, 4, 5], heads)
    for k in (1, 2, 4, 5):
        assert_same(comm.sent[k].tensors, expected[k])
    assert not torch.equal(comm.sent[1].tensors["head.bias"], comm.sent[4].tensors["head.bias"])


def test_server_state_is_plain_and_resumes():
    srv, init = server()
    clustered = {k: grouped(k) for k in range(6)}
    run_round(srv, init, 1, range(6), clustered)
    run_round(srv, init, 2, range(6), {k: grouped(0) for k in range(6)})  # ends the CCP
    state = pickle.loads(pickle.dumps(srv.state_dict()))
    assert "ctx" not in state and isinstance(state["G"], torch.Tensor) and state["in_ccp"] is False
    resumed, _ = server()
    resumed.load_state_dict(state)
    for s in (srv, resumed):
        run_round(s, init, 3, [0, 2, 5], clustered)
    assert resumed.heads.keys() == srv.heads.keys()
    assert all(torch.equal(resumed.heads[k]["head.bias"], srv.heads[k]["head.bias"]) for k in srv.heads)


class ShuffledComm(ScriptedComm):
    """Hands back the replies in a given order instead of client-id order."""

    def __init__(self, replies, order):
        super().__init__(replies)
        self.order = order

    def stream(self, messages):
        self.sent = dict(messages)
        for cid in self.order:
            yield cid, self.replies[cid]


def test_heads_are_kept_by_client_id_whatever_the_upload_order():
    heads = {k: grouped(k) for k in range(6)}
    clients = [5, 1, 3, 0, 4]
    results = []
    for order in (sorted(clients), [4, 0, 5, 3, 1], [3, 5, 1, 4, 0]):
        srv, init = server(head_weighting="samples")
        for rnd in (1, 2):
            comm = scripted(init, clients, heads)
            srv.run_round(rnd, clients, ShuffledComm(comm.replies, order))
        results.append(srv)
    first = results[0]
    # client 5 shares a group with 3 and 4 only, client 1 with 0 only
    assert torch.allclose(first.heads[5]["head.bias"], bias_mean([3, 4, 5], heads, [40.0, 50, 60]).float(), atol=1e-6)
    assert torch.allclose(first.heads[1]["head.bias"], bias_mean([0, 1], heads, [10.0, 20]).float(), atol=1e-6)
    for other in results[1:]:
        assert other.heads.keys() == first.heads.keys()
        for k in first.heads:
            assert_same(other.heads[k], first.heads[k])
        assert torch.equal(other.G, first.G)
        assert all(torch.allclose(other.body[k], first.body[k]) for k in first.body)


# --- the CCP's end and the history map in real runs -----------------------------------------------

# 10 clients in 5 label groups (s = 0.2, 20 samples each), all of them every round
DOMINANT = {"scheme": "dominant", "num_clients": 10, "groups": 5, "iid_fraction": 0.2, "samples_per_client": 20}


def real_run(monkeypatch, **options):
    """A tiny FedReMa run with real local training; also returns each round's uploaded heads by client."""
    from fedtail.engine.simulation import SimComm

    uploads: dict[int, dict[int, dict]] = {}
    accept = SimComm._accept

    def recording(self, answer):
        head = {k: v.clone() for k, v in answer.reply.tensors.items() if k.startswith("head.")}
        uploads.setdefault(self.rnd, {})[answer.cid] = head
        accept(self, answer)

    monkeypatch.setattr(SimComm, "_accept", recording)
    config = tiny_config(algorithm="fedrema", fraction=1.0, rounds=6, partition=DOMINANT, options=options)
    rows, sim = run(config)
    records = [log["fedrema"] for row in rows for log in row["rounds_log"]]
    return config, sim, records, uploads


def test_a_real_run_ends_the_ccp_by_itself_and_then_aggregates_heads_by_G(monkeypatch):
    # δ = 0.97: in this run the ratio Δs̄^t / max Δs̄ first drops below it in round 3 (0.967)
    config, sim, records, uploads = real_run(monkeypatch, delta=0.97)
    delta, n = 0.97, config.partition.num_clients
    ended = [r.get("ended", False) for r in records]
    assert ended.count(True) == 1
    end = ended.index(True)  # 0-based: the CCP's last round is round end + 1
    assert 1 <= end <= len(records) - 3  # it ended by itself, and Eq. 10 ran in at least two rounds
    assert all(r["ratio"] >= delta for r in records[:end]) and records[end]["ratio"] < delta
    assert records[end + 1 :] == [{"ccp": False, "ccp_rounds": end + 1}] * (len(records) - end - 1)
    srv = sim.server
    # G counts the MDS sets of the CCP rounds and nothing after
    G = torch.zeros(n, n, dtype=torch.int64)
    for record in records[: end + 1]:
        for k, members in zip(record["clients"], record["sets"]):
            G[k, members] += 1
    assert torch.equal(srv.G, G)
    assert len({tuple(row.tolist()) for row in G}) > 1  # clients weigh their peers differently
    # the heads after the last round: Eq. 10 over the heads the clients uploaded in it
    last = uploads[config.rounds]
    assert sorted(last) == list(range(n))
    heads = []
    for k in range(n):
        weights = G[k].double()
        expected = {
            key: sum(weights[j] * last[j][key].double() for j in range(n)) / weights.sum() for key in last[0]
        }
        for key, value in expected.items():
            assert torch.allclose(srv.heads[k][key].double(), value, atol=1e-6), (k, key)
        assert_same(sim.server.evaluation_message(k).tensors, srv.body | srv.heads[k])  # what k is evaluated with
        heads.append(srv.heads[k])
    # personalised: the heads differ between clients and from the FedAvg head of the round
    assert not torch.allclose(heads[0]["head.weight"], heads[2]["head.weight"], atol=1e-4)
    assert any(not torch.allclose(h["head.weight"], srv.global_head["head.weight"], atol=1e-4) for h in heads)


def test_the_ccp_end_of_any_delta_is_read_from_a_run_that_never_ends_it(monkeypatch):
    # Before its CCP ends a run with δ is the same as the run with MDS every round (ccp = false),
    # so that run's ratios give the CCP's end for every δ (how the Fashion-MNIST probe reads it).
    _, _, always, _ = real_run(monkeypatch, ccp=False)
    assert all(r["ccp"] and not r["ended"] for r in always)
    for delta in (0.9, 0.97, 0.99):
        _, _, records, _ = real_run(monkeypatch, delta=delta)
        below = [i for i, r in enumerate(always) if r["ratio"] < delta]
        end = next((i for i, r in enumerate(records) if r.get("ended")), None)
        assert end == (below[0] if below else None)
        last = len(records) if end is None else end + 1
        assert records[:last] == [r | {"ended": i == end} for i, r in enumerate(always[:last])]


def test_without_ccp_mds_runs_every_round():
    srv, init = server(ccp=False)
    run_round(srv, init, 1, range(6), {k: grouped(k) for k in range(6)})
    comm = run_round(srv, init, 2, range(6), {k: grouped(0) for k in range(6)})
    assert comm.logged["fedrema"]["ratio"] == pytest.approx(0.0, abs=1e-12) and not comm.logged["fedrema"]["ended"]
    comm = run_round(srv, init, 3, range(6), {k: grouped(k) for k in range(6)})
    log = comm.logged["fedrema"]
    assert srv.in_ccp and log["ccp"] and log["ccp_rounds"] == 3
    assert log["sets"] == [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3 and srv.G[0, 0] == 3


# --- the FedAvg ablation, options, runs --------------------------------------------------------


def test_without_mds_it_is_exactly_fedavg():
    # FedAvg with FedReMa's reference optimizer (momentum 0.9, clipping at 10), which a FedReMa run gets
    fed_rows, fedavg = run(tiny_config(algorithm="fedavg", train={"momentum": 0.9, "grad_clip": 10.0}))
    rows, fedrema = run(tiny_config(algorithm="fedrema", options={"mds": False}))
    assert strip_timing(rows) == strip_timing(fed_rows)  # personalised and global rows, logs, bytes
    assert_same(fedrema.server.global_weights(), fedavg.server.weights)
    for k in range(6):
        assert_same(fedrema.server.evaluation_message(k).tensors, fedavg.server.weights)
    # and with MDS the personalised rows differ
    mds_rows, _ = run(tiny_config(algorithm="fedrema"))
    assert [r["personalized_acc"] for r in mds_rows] != pytest.approx([r["personalized_acc"] for r in fed_rows])


@pytest.mark.parametrize(
    "assignment, needle",
    [
        ("fedrema.delta=1.5", "--set fedrema.delta"),
        ("fedrema.delta=-0.1", "--set fedrema.delta"),
        ("fedrema.temperature=0", "--set fedrema.temperature"),
        ("fedrema.head_weighting=median", "--set fedrema.head_weighting"),
        ("fedrema.mu=1", "unknown key"),
    ],
)
def test_bad_options_are_rejected(assignment, needle):
    assert_config_error("fedrema", [assignment], needle)


def test_cli_run_logs_the_ccp(tmp_path):
    result = run_cli(
        tmp_path, "fedrema", "fedrema.delta=0.9", "partition.groups=5",
        flags=["--partition", "dominant", "--samples-per-client", "20", "--rounds", "8"],
    )  # fmt: skip
    assert 1 / 5 < result.final["personalized_acc"] <= 1
    assert 0 <= result.final["global_acc"] <= 1
    records = [log["fedrema"] for log in result.logs]
    assert len(records) == 8
    flags = [r["ccp"] for r in records]
    assert flags == sorted(flags, reverse=True) and not flags[-1]  # once over, the CCP never comes back
    assert [r.get("ended") for r in records if r["ccp"]][-1] and sum(r.get("ended", False) for r in records) == 1
    mds_rounds = [r for r in records if r["ccp"]]
    assert [r["ccp_rounds"] for r in mds_rounds] == list(range(1, len(mds_rounds) + 1))
    assert all(len(s) == n for r in mds_rounds for s, n in zip(r["sets"], r["set_sizes"]))
    assert all(c in s for r in mds_rounds for c, s in zip(r["clients"], r["sets"]))


def test_serial_and_parallel_agree():
    assert_serial_and_parallel_agree(tiny_config(algorithm="fedrema", rounds=3))


def test_the_code_feature_gives_each_row_its_own_half_scale_draw(monkeypatch):
    """random_feature = "code": row k of S is the heads' response to client k's own r_k ~ U[0, 0.5)."""
    features, rows = [], []
    real_soft, real_cos = fedrema_module.soft_logits, fedrema_module.cosine_matrix

    def soft(head, heads, r, temperature, prefix="head."):
        features.append(r.clone())
        return real_soft(head, heads, r, temperature, prefix)

    def cos(a, b):
        out = real_cos(a, b)
        rows.append(out)
        return out

    monkeypatch.setattr(fedrema_module, "soft_logits", soft)
    monkeypatch.setattr(fedrema_module, "cosine_matrix", cos)
    gen = torch.Generator().manual_seed(3)
    heads = {k: {"head.weight": torch.randn(5, 64, generator=gen), "head.bias": torch.zeros(5)} for k in range(6)}
    def round_with(srv, init):
        body = {k: v for k, v in init.items() if k.startswith("body.")}
        srv.run_round(1, list(range(6)), ScriptedComm({c: reply(body | heads[c], SIZES[c]) for c in range(6)}))

    round_with(*server(random_feature="code"))
    assert len(features) == 6 and len({tuple(r.tolist()) for r in features}) == 6  # a draw per row
    assert all(0 <= float(r.min()) and float(r.max()) < 0.5 for r in features)
    assert float(torch.stack(features).max()) > 0.4  # scaled by one half, not by less
    assert len(rows) == 6
    for i, (r, row) in enumerate(zip(features, rows)):  # row i by hand, under client i's own draw
        p = torch.softmax(torch.stack([heads[k]["head.weight"] @ r for k in range(6)]).double() / 0.5, dim=1)
        expected = torch.nn.functional.cosine_similarity(p[i : i + 1], p, dim=1)
        torch.testing.assert_close(row[0].double(), expected, atol=1e-5, rtol=0)
    # the paper's rule: one draw in [0, 1) for the whole matrix
    features.clear()
    rows.clear()
    round_with(*server())
    assert len(features) == 1 and rows[0].shape == (6, 6)


@pytest.mark.parametrize("mds", [True, False])
def test_similarity_rounds_log_s_without_changing_anything(mds):
    """``similarity_rounds`` logs S(t) (Fig. 3), under MDS or FedAvg's heads (mds off), and changes no result."""
    plain, _ = run(algorithm_config("fedrema", options={"mds": mds}))
    logged, sim = run(algorithm_config("fedrema", options={"mds": mds, "similarity_rounds": [1, 3]}))
    records = {log["round"]: log["fedrema_similarity"] for row in logged for log in row["rounds_log"]
               if "fedrema_similarity" in log}  # fmt: skip
    assert sorted(records) == [1, 3]
    for rnd, rec in records.items():
        S = rec["S"]
        assert rec["round"] == rnd and rec["clients"] == sorted(rec["clients"]) and len(S) == len(rec["clients"])
        assert all(s == pytest.approx(1.0, abs=1e-4) for s in (S[i][i] for i in range(len(S))))  # cosine with itself
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} | {"rounds_log": [  # noqa: E731
        {k: v for k, v in log.items() if k != "fedrema_similarity"} for log in r["rounds_log"]]} for r in rows]
    assert strip(logged) == strip(plain)


def test_table4_variants_align_features_to_global_prototypes_fedpac_style(monkeypatch):
    """FedReMa+F / +A&F (Table 4): FedPAC's alignment loss on the body's features, to the server's
    per-class mean of the clients' prototypes (and, +A&F, the head trained first with the body frozen)."""
    from fedtail.algorithms import fedrema as module

    joint, _ = run(algorithm_config("fedrema"))
    calls = {"align": [], "train_only": []}
    original_align, original_only = module.alignment_loss, module.train_only

    def align(protos, present, lam, alignment):
        calls["align"].append((protos.shape, bool(present.any()), lam, alignment))
        return original_align(protos, present, lam, alignment)

    def only(ctx, trained, frozen, epochs, **kw):
        calls["train_only"].append((trained is ctx.model().head, epochs, "hook" in kw))
        return original_only(ctx, trained, frozen, epochs, **kw)

    monkeypatch.setattr(module, "alignment_loss", align)
    monkeypatch.setattr(module, "train_only", only)
    aligned, sim = run(algorithm_config("fedrema", options={"client_training": "align", "align_lam": 2.0}))
    assert sim.server.present is not None and bool(sim.server.present.all())
    assert calls["align"] and all(lam == 2.0 and alignment == "mse" for _, _, lam, alignment in calls["align"])
    assert strip_timing(aligned)[0]["personalized_acc"] == strip_timing(joint)[0]["personalized_acc"]  # round 1: no prototypes yet
    assert strip_timing(aligned) != strip_timing(joint)
    assert not calls["train_only"]
    run(algorithm_config("fedrema", options={"client_training": "alternate-align", "align_head_epochs": 2}))
    heads = [c for c in calls["train_only"] if c[0]]
    assert heads and all(epochs == 2 for _, epochs, _ in heads)  # the head first, with the body frozen
    assert all(has_loss for is_head, _, has_loss in calls["train_only"] if not is_head)  # then the aligned body
    _, joint_sim = run(algorithm_config("fedrema"))
    assert "protos" not in vars(joint_sim.server)  # the default keeps no prototypes
