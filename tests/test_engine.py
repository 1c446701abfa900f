"""The engine: aggregation maths, determinism, serial = parallel, the message contract."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.components import build_config
from fedtail.algorithms.aggregate import WeightedMean, weighted_mean
from fedtail.algorithms.base import Algorithm, ClientHalf, EdgeHalf, FeatureTerm, Message, ServerHalf, StepHook
from fedtail.engine import prepare
from fedtail.engine.simulation import Simulation, assign_edges, sample_clients
from helpers import assert_serial_and_parallel_agree, run, run_with_summary, strip_timing


# --- aggregation -------------------------------------------------------------------------------


def test_weighted_mean_matches_formula():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(4, dtype=torch.int64)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(8, dtype=torch.int64)}
    out = weighted_mean([(a, 1.0), (b, 3.0)])
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert out["w"].dtype == torch.float32
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 7


def test_weighted_mean_rejects_mismatch_and_empty():
    acc = WeightedMean()
    acc.add({"w": torch.zeros(2)}, 1.0)
    with pytest.raises(KeyError):
        acc.add({"v": torch.zeros(2)}, 1.0)
    with pytest.raises(ValueError):
        WeightedMean().result()


def test_weighted_mean_is_order_independent_to_float32():
    g = torch.Generator().manual_seed(0)
    items = [({"w": torch.randn(100, generator=g)}, float(i + 1)) for i in range(7)]
    forward = weighted_mean(items)["w"]
    backward = weighted_mean(items[::-1])["w"]
    assert torch.equal(forward, backward)


# --- sampling and edges ------------------------------------------------------------------------


def test_client_sampling_is_seeded_per_round():
    a = [sample_clients(3, r, 50, 10) for r in range(1, 6)]
    b = [sample_clients(3, r, 50, 10) for r in range(1, 6)]
    assert a == b
    assert all(len(set(s)) == 10 and s == sorted(s) for s in a)
    assert a != [sample_clients(4, r, 50, 10) for r in range(1, 6)]
    assert len({tuple(s) for s in a}) > 1  # rounds differ


def test_edge_assignment_rules():
    cfg = tiny_config(edges=2, edge_assignment="contiguous")
    assert assign_edges(cfg, 6).tolist() == [0, 0, 0, 1, 1, 1]
    cfg = tiny_config(edges=2, edge_assignment="round-robin")
    assert assign_edges(cfg, 6).tolist() == [0, 1, 0, 1, 0, 1]
    cfg = tiny_config(edges=3, edge_assignment="random")
    edges = assign_edges(cfg, 6)
    assert sorted(np.bincount(edges).tolist()) == [2, 2, 2]


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_same_seed_same_result_other_seed_differs(algorithm):
    r1, _ = run(tiny_config(algorithm=algorithm))
    r2, _ = run(tiny_config(algorithm=algorithm))
    r3, _ = run(tiny_config(algorithm=algorithm, seed=1))
    assert strip_timing(r1) == strip_timing(r2)
    assert r1[-1]["personalized_acc"] != pytest.approx(r3[-1]["personalized_acc"]) or r1[-1][
        "train_loss"
    ] != pytest.approx(r3[-1]["train_loss"])


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_serial_and_parallel_agree_exactly(algorithm):
    assert_serial_and_parallel_agree(tiny_config(algorithm=algorithm))


def test_channels_last_cnn_is_exact_across_workers_and_close_to_the_default_layout():
    def cnn(**overrides):
        raw = tiny_raw(dataset="digits", model="cnn-fmnist", rounds=2, **overrides)
        raw["dataset_options"] = {}
        return build_config(raw)

    sim, _ = assert_serial_and_parallel_agree(cnn())
    assert sim.workspace.model().channels_last  # the default
    plain, plain_sim = run(cnn(channels_last=False))
    assert not plain_sim.workspace.model().channels_last
    a, b = sim.server.global_weights(), plain_sim.server.global_weights()
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


def test_evaluation_frequency_does_not_change_training():
    every, _ = run(tiny_config(eval_every=1, rounds=4))
    once, _ = run(tiny_config(eval_every=4, rounds=4))
    assert every[-1]["personalized_acc"] == once[-1]["personalized_acc"]
    assert every[-1]["global_acc"] == once[-1]["global_acc"]
    assert len(once[-1]["rounds_log"]) == 4


def test_eval_final_evaluates_each_of_the_last_rounds_and_leaves_training_alone():
    config = tiny_config(eval_every=3, eval_final=2, rounds=7)
    assert [r for r in range(1, 8) if config.plan.evaluates(r)] == [3, 6, 7]
    config = tiny_config(eval_every=5, eval_final=3, rounds=10)
    assert [r for r in range(1, 11) if config.plan.evaluates(r)] == [5, 8, 9, 10]
    dense, _ = run(tiny_config(eval_every=4, eval_final=2, rounds=4))
    assert [row["round"] for row in dense] == [3, 4]
    every, _ = run(tiny_config(eval_every=1, rounds=4))
    assert dense[-1]["per_client_acc"] == every[-1]["per_client_acc"]  # counts over the same samples
    assert dense[0]["per_client_acc"] == every[2]["per_client_acc"]


def test_fedavg_with_one_client_equals_local_training():
    """With one client, averaging is the identity: FedAvg must reproduce Local exactly."""
    part = {"scheme": "iid", "num_clients": 1}
    fed, _ = run(tiny_config(algorithm="fedavg", partition=part, fraction=1.0))
    loc, _ = run(tiny_config(algorithm="local", partition=part, fraction=1.0))
    assert fed[-1]["per_client_acc"] == loc[-1]["per_client_acc"]
    assert fed[-1]["train_loss"] == loc[-1]["train_loss"]


def test_training_improves_over_rounds():
    rows, _ = run(tiny_config(rounds=8, fraction=1.0, train={"local_epochs": 2}))
    assert rows[-1]["personalized_acc"] > rows[0]["personalized_acc"]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_metrics_row_contents():
    summary, rows, sim = run_with_summary(tiny_config(rounds=2))
    row = rows[-1]
    assert len(row["per_client_acc"]) == 6 and len(row["per_class_acc"]) == 5
    for key in ("personalized_acc", "personalized_acc_weighted", "global_acc", "head_acc", "tail_acc"):
        assert 0.0 <= row[key] <= 1.0
    # 3 of 6 clients per round, each trains one epoch of its data
    trained = sum(r["samples"] for r in rows[0]["rounds_log"]) + sum(r["samples"] for r in rows[1]["rounds_log"])
    assert summary["samples_trained"] == trained > 0
    assert summary["bytes"]["down"] > 0 and summary["bytes"]["up"] == summary["bytes"]["down"]
    json.dumps(summary)


def test_local_has_no_global_model_and_no_uplink():
    summary, rows, _ = run_with_summary(tiny_config(algorithm="local"))
    assert rows[-1]["global_acc"] is None
    assert summary["final"]["global_acc"] is None
    assert summary["bytes"]["up"] == 0


# --- the contract: several exchanges, per-client payloads, edges, state ------------------------


class _TwoStepServer(ServerHalf):
    """First asks each client for a statistic, then sends each client its own payload."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.seen: list = []

    def run_round(self, rnd, clients, comm):
        counts = comm.exchange({cid: Message("count") for cid in clients})
        assert list(counts) == sorted(clients)
        messages = {cid: Message("remember", {"x": torch.tensor([float(cid * 10 + rnd)])}) for cid in clients}
        edges = comm.exchange_via_edges(messages)
        self.seen.append({e: sorted(r) for e, r in edges.items()})
        comm.log(edge_keys={str(e): sorted(r) for e, r in edges.items()})

    def evaluation_message(self, cid):
        return Message("evaluate")


class _TwoStepClient(ClientHalf):
    def count(self, msg, ctx):
        return Message("reply", metrics={"n": float(ctx.data.num_train)})

    def remember(self, msg, ctx):
        ctx.state.setdefault("history", []).append(float(msg.tensors["x"]))
        return Message("reply", {"x": msg.tensors["x"] + 1})

    def evaluate(self, msg, ctx):
        with pytest.raises(TypeError):
            ctx.state["touched_by_eval"] = True  # evaluation sees a read-only state
        ctx.load(ctx.init_weights)
        return ctx.evaluate()


class _SumEdge(EdgeHalf):
    def reduce(self, edge_id, replies):
        total = sum(float(m.tensors["x"]) for m in replies.values())
        return {-1 - edge_id: Message("edge", {"sum": torch.tensor([total])})}


Algorithm("test-two-step", "test only", _TwoStepServer, _TwoStepClient, edge=_SumEdge)


def test_multi_exchange_edges_and_client_state():
    config = tiny_config(algorithm="test-two-step", fraction=1.0, rounds=2, edges=2)
    summary, rows, sim = run_with_summary(config)
    assert sim.meter.exchanges == 4  # two per round
    assert sim.server.seen[0] == {0: [-1], 1: [-2]}
    assert rows[-1]["rounds_log"][0]["edge_keys"] == {"0": [-1], "1": [-2]}
    for cid in range(6):
        state = sim.client_state[cid]
        assert state["history"] == [cid * 10 + 1.0, cid * 10 + 2.0]  # per-client payloads, kept across rounds
        assert "touched_by_eval" not in state
    assert summary["bytes"]["edge_up"] == 2 * 2 * 4  # two edges, two rounds, one float32 each


def test_partition_survives_moving_the_dataset_to_shared_memory():
    """The process pool moves dataset tensors to shared memory; partition label views must not dangle."""
    config = tiny_config(workers=2)
    dataset, partition = prepare(config)
    before = partition.summary()
    sim = Simulation(config, dataset, partition)
    try:
        assert partition.summary() == before
    finally:
        sim.executor.close()


def test_feature_loss_sees_the_body_output_and_zero_loss_changes_nothing():
    """ctx.train(hook=FeatureTerm(...)) runs body and head apart: same steps when the term is zero,
    the features it gets are model.features(x), and a real term moves the weights."""
    from fedtail.engine.context import ClientContext
    from helpers import runtime

    rt = runtime(tiny_config())

    def context() -> ClientContext:
        return ClientContext(0, 1, 7, rt.views.at(1)[0], rt.workspace, rt.options)

    seen: list[torch.Tensor] = []

    def zero(model, x, y, logits, features):
        seen.append(features.detach().clone())
        assert torch.allclose(model.head(features), logits)
        return 0.0 * features.sum()

    def pull(model, x, y, logits, features):
        return 10.0 * features.pow(2).mean()

    init = rt.workspace.init_weights
    results = []
    for loss in (None, zero, pull):
        ctx = context()
        ctx.load(init)
        ctx.train(epochs=1, hook=FeatureTerm(loss))
        results.append(ctx.weights())
    assert seen and seen[0].shape[1] == ctx.model().feature_dim
    for k in results[0]:
        assert torch.equal(results[0][k], results[1][k]), k
    assert any(not torch.equal(results[0][k], results[2][k]) for k in results[0])


def test_a_step_hook_sees_every_pass_and_step_and_adds_its_term():
    """One StepHook: before_epoch per pass over the data, loss per batch (added to the
    cross-entropy), after_step per step with the batch's cross-entropy; a term of zero changes nothing."""
    from fedtail.engine.context import ClientContext
    from helpers import runtime

    rt = runtime(tiny_config())

    class Seen(StepHook):
        def __init__(self, coef):
            self.coef, self.epochs, self.losses, self.steps = coef, [], [], []

        def before_epoch(self, epoch):
            self.epochs.append(epoch)

        def loss(self, model, x, y, logits, features):
            assert features is None  # features = False: one forward
            self.losses.append(len(y))
            return self.coef * logits.pow(2).mean()

        def after_step(self, loss):
            assert loss.dim() == 0 and not loss.requires_grad
            self.steps.append(float(loss))

    results = []
    for hook in (None, Seen(0.0), Seen(1.0)):
        ctx = ClientContext(0, 1, 7, rt.views.at(1)[0], rt.workspace, rt.options)
        ctx.load(rt.workspace.init_weights)
        stats = ctx.train(epochs=2, hook=hook)
        results.append(ctx.weights())
        if hook is not None:
            assert hook.epochs == [0, 1] and len(hook.steps) == stats.steps == len(hook.losses)
            assert sum(hook.losses) == stats.samples
            weighted = sum(l * n for l, n in zip(hook.steps, hook.losses)) / stats.samples
            assert weighted == pytest.approx(stats.loss, rel=1e-6)  # each step's CE, as the stats sum it
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
    assert any(not torch.equal(results[0][k], results[2][k]) for k in results[0])


def test_the_batch_schedule_marks_a_new_pass_at_every_reshuffle():  # the hook call itself: the test above
    import torch

    from fedtail.engine.training import _schedule

    index = torch.arange(10)
    passes = [e for e, _ in _schedule(index, 4, torch.Generator().manual_seed(0), 3, None) if e is not None]
    assert passes == [0, 1, 2]  # 3 epochs of 3 batches each
    steps = [e for e, _ in _schedule(index, 4, torch.Generator().manual_seed(0), 1, 7) if e is not None]
    assert steps == [0, 1, 2]  # 7 steps: 3 + 3 + 1 batches, a new pass at each reshuffle


def test_the_wire_names_what_the_engine_reads_in_a_reply():
    from fedtail import wire

    c, t = torch.tensor([1, 2]), torch.tensor([3, 4])
    tensors = wire.eval_tensors(c, t, {"gp": c + 1}, (c[None], t[None]), {"gp": c[None] + 1})
    assert list(tensors) == ["correct", "total", "correct:gp", "stage_correct", "stage_total", "stage_correct:gp"]
    assert wire.named_accuracies(tensors) == ["gp"]
    assert torch.equal(tensors[wire.stage_key(wire.correct_key("gp"))], c[None] + 1)
    assert Message("reply", metrics={wire.NUM_EXAMPLES: 7.0}).num_examples == 7.0
    with pytest.raises(KeyError, match="without 'num_examples'.*ctx.reply"):
        Message("fit").num_examples
